#!/usr/bin/env python3
"""Times iptables-nft-restore (and iptables-legacy-restore) on variations of kube-proxy-rs'
cold full payload, to find where iptables-nft's cost comes from.

Run as root from the workspace; every load goes into a fresh network namespace
(`ip netns add kpvar-...`) that is deleted afterwards, under `timeout`.

    python3 crates/bench/scripts/iptables_nft_variations.py --kp-bench target/release/kp-bench \
        --sizes 1000,2000,5000,10000 --timeout 600

Variations (the kernel ends up with the same rules except where noted):
  as-is          the payload kube-proxy-rs sends (chains declared first, sorted by name)
  zero-first     `-Z` (zero counters, no chain) as the first command of each table
  desc-decls     chain declarations in descending name order
  no-sep         DNAT directly in the KUBE-SVC chains, no KUBE-SEP chains (NOT upstream's
                 layout: shows how the cost depends on the number of chains)
  batches-100    one restore per 100 Services (NOT atomic), then one for KUBE-SERVICES
"""
import argparse, os, re, subprocess, sys, time, json

def run(cmd, stdin=None, timeout=600):
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    dt = time.monotonic() - t
    if p.returncode in (124, 137):
        return None, "timeout"
    if p.returncode != 0:
        return None, "failed: " + p.stderr.decode(errors="replace")[:300]
    return dt, "ok"

def in_ns(name, argv, stdin, timeout):
    return run(["timeout", "--kill-after=10", str(timeout), "ip", "netns", "exec", name] + argv, stdin, timeout)

def tables(payload):
    """Splits a payload into [(table, decls, rules, tail)]."""
    out = []
    for block in re.findall(r"^\*(\w+)\n(.*?)^COMMIT\n", payload, re.S | re.M):
        name, body = block
        decls = [l for l in body.splitlines() if l.startswith(":")]
        rules = [l for l in body.splitlines() if not l.startswith(":")]
        out.append((name, decls, rules))
    return out

def join(tbls, zero=False, desc=False):
    s = []
    for name, decls, rules in tbls:
        s.append("*" + name)
        if zero:
            s.append("-Z")
        s.extend(sorted(decls, reverse=True) if desc else decls)
        s.extend(rules)
        s.append("COMMIT")
    return "\n".join(s) + "\n"

def no_sep(tbls):
    out = []
    for name, decls, rules in tbls:
        if name != "nat":
            out.append((name, decls, rules)); continue
        dnat = {}
        for r in rules:
            m = re.match(r"-A (KUBE-SEP-\w+) .*-j DNAT --to-destination (\S+)", r)
            if m:
                dnat[m.group(1)] = m.group(2)
        decls2 = [d for d in decls if not d.startswith(":KUBE-SEP-")]
        rules2 = []
        for r in rules:
            if r.startswith("-A KUBE-SEP-"):
                continue
            m = re.search(r"-j (KUBE-SEP-\w+)$", r)
            if m and m.group(1) in dnat:
                chain = r.split()[1]
                rest = r[len("-A " + chain):m.start()]
                r = "-A " + chain + " -p tcp -m tcp" + rest + "-j DNAT --to-destination " + dnat[m.group(1)]
            rules2.append(r)
        out.append((name, decls2, rules2))
    return out

def batches(tbls, per=100):
    """The fixed chains first, then one payload per `per` Services' SVC+SEP chains, then
    KUBE-SERVICES, KUBE-NODEPORTS and the KUBE-EXT chains (NOT atomic)."""
    nat = [t for t in tbls if t[0] == "nat"][0]
    other = [t for t in tbls if t[0] != "nat"]
    _, decls, rules = nat
    by_chain = {}
    for r in rules:
        by_chain.setdefault(r.split()[1], []).append(r)
    names = [d[1:].split()[0] for d in decls]
    base = ["KUBE-POSTROUTING", "KUBE-MARK-MASQ"]
    last = ["KUBE-SERVICES", "KUBE-NODEPORTS"] + [c for c in names if c.startswith("KUBE-EXT-")]
    groups = []
    for c in names:
        if c.startswith("KUBE-SVC-"):
            groups.append([c] + [r.split()[-1] for r in by_chain.get(c, []) if r.split()[-1].startswith("KUBE-SEP-")])
    def block(chains):
        s = ["*nat"] + [":%s - [0:0]" % c for c in chains]
        for c in chains:
            s.extend(by_chain.get(c, []))
        s.append("COMMIT")
        return "\n".join(s) + "\n"
    payloads = [join(other) + block(base)]
    for i in range(0, len(groups), per):
        payloads.append(block([c for g in groups[i:i + per] for c in g]))
    payloads.append(block(last))
    return payloads

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kp-bench", required=True)
    ap.add_argument("--sizes", default="1000,2000")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--variations", default="as-is,zero-first,desc-decls,no-sep,batches-100")
    ap.add_argument("--tools", default="iptables-nft-restore,iptables-legacy-restore")
    a = ap.parse_args()
    results = []
    for n in [int(x) for x in a.sizes.split(",")]:
        payload = subprocess.run([a.kp_bench, "dump", "--services", str(n)], capture_output=True, check=True).stdout.decode()
        tbls = tables(payload)
        for var in a.variations.split(","):
            if var == "as-is": p = [payload]
            elif var == "zero-first": p = [join(tbls, zero=True)]
            elif var == "desc-decls": p = [join(tbls, desc=True)]
            elif var == "no-sep": p = [join(no_sep(tbls))]
            elif var == "batches-100": p = batches(tbls)
            else: sys.exit("unknown variation " + var)
            for tool in a.tools.split(","):
                ns = "kpvar-%d-%s" % (os.getpid(), var)
                subprocess.run(["ip", "netns", "add", ns], check=True)
                try:
                    total, status = 0.0, "ok"
                    for part in p:
                        dt, status = in_ns(ns, [tool, "--noflush", "--counters"], part.encode(), a.timeout)
                        if dt is None:
                            break
                        total += dt
                    again = None
                    if status == "ok" and len(p) == 1:
                        # The same payload over the loaded rules: a full resync.
                        again, _ = in_ns(ns, [tool, "--noflush", "--counters"], p[0].encode(), a.timeout)
                    lines = sum(x.count("\n") for x in p)
                    r = {"services": n, "variation": var, "tool": tool, "status": status,
                         "load_s": round(total, 3) if status == "ok" else None,
                         "reload_s": round(again, 3) if again else None, "lines": lines}
                finally:
                    subprocess.run(["ip", "netns", "del", ns])
                print(json.dumps(r), flush=True)
                results.append(r)
    return results

if __name__ == "__main__":
    main()
