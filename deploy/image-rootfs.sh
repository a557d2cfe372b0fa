#!/bin/sh
# Lays out, under ROOT, the file tree of the kube-proxy-rs image: the daemon, the programs it
# runs, and exactly the files those load: no shell, no package manager, nothing else (the idea of
# upstream's registry.k8s.io/build-image/distroless-iptables). deploy/Dockerfile runs it on
# Debian with iptables, nftables and ipset installed and copies ROOT into an empty image;
# kube-proxy-rs/tests/deploy.rs runs it on the test machine and runs the result in a chroot.
#
#   deploy/image-rootfs.sh ROOT DAEMON
#
# The programs (every one the daemon can exec; tests/deploy.rs checks this list against the
# code): both iptables backends' save/restore tools for both families, under their
# backend-specific names and the plain ones (which point at the nf_tables backend, Debian's
# default), `nft` (nftables mode) and `ipset` (IPVS mode). Their shared libraries, the
# dynamic loader, the iptables extensions (loaded at run time) and the few files under /etc they
# read are copied from this system, so the libraries are the ones the programs were built with.
set -eu

root=${1:?usage: image-rootfs.sh ROOT DAEMON}
daemon=${2:?usage: image-rootfs.sh ROOT DAEMON}

programs="/usr/sbin/xtables-legacy-multi /usr/sbin/xtables-nft-multi /usr/sbin/nft /usr/sbin/ipset"
legacy_names="iptables-legacy iptables-legacy-save iptables-legacy-restore
ip6tables-legacy ip6tables-legacy-save ip6tables-legacy-restore"
nft_names="iptables-nft iptables-nft-save iptables-nft-restore
ip6tables-nft ip6tables-nft-save ip6tables-nft-restore"
plain_names="iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore"

mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib" "$root/usr/lib64" "$root/usr/local/bin" \
    "$root/etc" "$root/proc" "$root/sys" "$root/dev" "$root/run" "$root/tmp" \
    "$root/var/lib/kube-proxy"
chmod 1777 "$root/tmp"
# Debian's merged /usr: the loader is /lib64/ld-linux-x86-64.so.2 in every ELF file.
for d in bin sbin lib lib64; do
    [ -e "$root/$d" ] || ln -s "usr/$d" "$root/$d"
done

# copy PATH: the file at PATH (a /lib path as its /usr/lib name), and when it is a symbolic
# link, the link and what it points to, so every name a program or the loader uses resolves.
copy() {
    path=$1
    case $path in
        /lib/* | /lib64/* | /bin/* | /sbin/*) path=/usr$path ;;
    esac
    [ -e "$root$path" ] || [ -L "$root$path" ] && return 0
    mkdir -p "$root$(dirname "$path")"
    cp -a "$path" "$root$path"
    if [ -L "$path" ]; then
        copy "$(readlink -f "$path")"
    fi
}

# libs FILE: the shared libraries FILE needs, and the loader.
libs() {
    ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
}

install -m 0755 "$daemon" "$root/usr/local/bin/kube-proxy-rs"
for p in $programs; do
    copy "$p"
done
for n in $legacy_names; do
    ln -sf xtables-legacy-multi "$root/usr/sbin/$n"
done
for n in $nft_names; do
    ln -sf xtables-nft-multi "$root/usr/sbin/$n"
done
for n in $plain_names; do
    # iptables-save -> iptables-nft-save
    ln -sf "${n%%tables*}tables-nft${n#*tables}" "$root/usr/sbin/$n"
done

# The iptables extensions (libxt_*.so, libipt_*.so, libip6t_*.so), loaded by name at run time.
xtables=$(ls -d /usr/lib/*/xtables)
mkdir -p "$root$xtables"
cp -a "$xtables/." "$root$xtables/"

for f in "$daemon" $programs "$xtables"/*.so; do
    libs "$f"
done | sort -u | while read -r lib; do
    copy "$lib"
done

# Read by the programs: protocol and service names, Ethernet types (iptables), the resolver's
# order (the daemon resolves a kubeconfig's server name through the node's DNS).
for f in /etc/protocols /etc/services /etc/ethertypes /etc/nsswitch.conf; do
    if [ -e "$f" ]; then
        cp -a "$f" "$root$f"
    fi
done
