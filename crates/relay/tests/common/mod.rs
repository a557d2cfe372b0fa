//! Test helpers: loopback backends (TCP and UDP), a black-hole endpoint, and shortcuts for
//! driving a [`Relay`] from async tests. Every socket here is on 127.0.0.1 or ::1.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kp_relay::{ListenerSpec, Protocol, Relay, RelayConfig, RelayError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

/// 127.0.0.1:`port`.
pub fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// A relay on the current runtime binding 127.0.0.1, with `cfg`'s other settings.
pub fn relay(cfg: RelayConfig) -> Relay {
    Relay::new(
        RelayConfig {
            bind: Ipv4Addr::LOCALHOST.into(),
            ..cfg
        },
        tokio::runtime::Handle::current(),
    )
}

/// A spec named after `name`.
pub fn spec(
    name: &str,
    protocol: Protocol,
    affinity: Option<Duration>,
    endpoints: &[SocketAddr],
) -> ListenerSpec {
    ListenerSpec {
        name: name.to_owned(),
        protocol,
        affinity,
        endpoints: endpoints.into(),
    }
}

/// A TCP spec without affinity.
pub fn tcp(endpoints: &[SocketAddr]) -> ListenerSpec {
    spec("default/web:http", Protocol::Tcp, None, endpoints)
}

/// `Relay::apply` from a blocking thread, as the proxier calls it.
pub async fn apply(
    relay: &Relay,
    specs: Vec<(&str, ListenerSpec)>,
) -> BTreeMap<String, Result<u16, RelayError>> {
    let relay = relay.clone();
    let specs: BTreeMap<String, ListenerSpec> =
        specs.into_iter().map(|(k, s)| (k.to_owned(), s)).collect();
    tokio::task::spawn_blocking(move || relay.apply(&specs))
        .await
        .unwrap()
}

/// `apply` with one key, returning its port.
pub async fn apply_one(relay: &Relay, key: &str, spec: ListenerSpec) -> u16 {
    let out = apply(relay, vec![(key, spec)]).await;
    *out[key].as_ref().unwrap()
}

/// What a TCP backend does with each connection.
#[derive(Clone, Copy)]
pub enum Mode {
    /// Writes its name and a newline, then echoes until EOF, then closes.
    NameEcho,
    /// Reads to EOF, then writes everything back and closes.
    EchoAfterEof,
    /// Closes at once with SO_LINGER 0 (a reset).
    Reset,
    /// Writes this many bytes of [`pattern`] and closes.
    Send(usize),
    /// Concurrently writes this many bytes of [`pattern`] and reads to EOF; then writes the
    /// checksum of what it read (8 bytes, little endian) and closes.
    Duplex(usize),
}

/// A TCP backend on 127.0.0.1 with a name; aborts its accept loop when dropped.
pub struct Backend {
    pub addr: SocketAddr,
    pub name: String,
    pub accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Backend {
    pub async fn start(name: &str, mode: Mode) -> Backend {
        // A deep accept queue: a burst of 1,000 connects must not overflow it.
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(local(0)).unwrap();
        Backend::serve(socket.listen(4096).unwrap(), name, mode)
    }

    pub fn serve(listener: TcpListener, name: &str, mode: Mode) -> Backend {
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let name_owned = name.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let name = name_owned.clone();
                tokio::spawn(handle(stream, name, mode));
            }
        });
        Backend {
            addr,
            name: name.to_owned(),
            accepted,
            task,
        }
    }
}

async fn handle(mut s: TcpStream, name: String, mode: Mode) {
    match mode {
        Mode::NameEcho => {
            if s.write_all(format!("{name}\n").as_bytes()).await.is_err() {
                return;
            }
            let (mut r, mut w) = s.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        }
        Mode::EchoAfterEof => {
            let mut all = Vec::new();
            if s.read_to_end(&mut all).await.is_ok() {
                let _ = s.write_all(&all).await;
                let _ = s.shutdown().await;
            }
        }
        Mode::Reset => {
            let _ = s.set_zero_linger();
            drop(s);
        }
        Mode::Send(n) => {
            let _ = write_pattern(&mut s, n, 7).await;
            let _ = s.shutdown().await;
        }
        Mode::Duplex(n) => {
            let (mut r, mut w) = s.into_split();
            let writer = tokio::spawn(async move {
                write_pattern(&mut w, n, 3).await.unwrap();
                w
            });
            let (sum, _) = read_checksum(&mut r).await.unwrap();
            let mut w = writer.await.unwrap();
            let _ = w.write_all(&sum.to_le_bytes()).await;
            let _ = w.shutdown().await;
        }
    }
}

/// Word `k` (bytes `8k..8k+8`, little endian) of the test pattern with `seed`.
fn pattern_word(k: usize, seed: u8) -> u64 {
    (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ u64::from(seed).wrapping_mul(0x0101_0101_0101_0101)
}

/// The byte at offset `i` of the test pattern with `seed`.
pub fn pattern_byte(i: usize, seed: u8) -> u8 {
    pattern_word(i / 8, seed).to_le_bytes()[i % 8]
}

/// Fills `buf` with the pattern from offset `off` (a multiple of 8).
fn fill_pattern(buf: &mut [u8], off: usize, seed: u8) {
    debug_assert_eq!(off % 8, 0);
    let mut chunks = buf.chunks_exact_mut(8);
    let mut k = off / 8;
    for c in &mut chunks {
        c.copy_from_slice(&pattern_word(k, seed).to_le_bytes());
        k += 1;
    }
    let tail = chunks.into_remainder();
    for (j, b) in tail.iter_mut().enumerate() {
        *b = pattern_word(k, seed).to_le_bytes()[j];
    }
}

/// Writes `n` bytes of the pattern with `seed`.
pub async fn write_pattern<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    n: usize,
    seed: u8,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut off = 0;
    while off < n {
        let len = buf.len().min(n - off);
        fill_pattern(&mut buf[..len], off, seed);
        w.write_all(&buf[..len]).await?;
        off += len;
    }
    Ok(())
}

/// An order-sensitive checksum (FNV-1a over 8-byte words plus the tail).
#[derive(Clone, Copy)]
pub struct Checksum {
    state: u64,
    carry: [u8; 8],
    carried: usize,
    pub len: usize,
}

impl Default for Checksum {
    fn default() -> Self {
        Checksum {
            state: 0xcbf2_9ce4_8422_2325,
            carry: [0; 8],
            carried: 0,
            len: 0,
        }
    }
}

impl Checksum {
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len();
        while self.carried > 0 && !data.is_empty() {
            self.carry[self.carried] = data[0];
            self.carried = (self.carried + 1) % 8;
            data = &data[1..];
            if self.carried == 0 {
                self.word(u64::from_le_bytes(self.carry));
            }
        }
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().unwrap()));
        }
        for &b in chunks.remainder() {
            self.carry[self.carried] = b;
            self.carried += 1;
        }
    }

    fn word(&mut self, w: u64) {
        self.state = (self.state ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }

    pub fn finish(mut self) -> u64 {
        for i in 0..self.carried {
            self.word(u64::from(self.carry[i]));
        }
        self.state ^ self.len as u64
    }
}

/// The checksum of `n` bytes of the pattern with `seed`.
pub fn pattern_checksum(n: usize, seed: u8) -> u64 {
    let mut c = Checksum::default();
    let mut buf = vec![0u8; 256 * 1024];
    let mut off = 0;
    while off < n {
        let len = buf.len().min(n - off);
        fill_pattern(&mut buf[..len], off, seed);
        c.update(&buf[..len]);
        off += len;
    }
    c.finish()
}

/// Reads to EOF, returning the checksum and length of what was read.
pub async fn read_checksum<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<(u64, usize)> {
    let mut c = Checksum::default();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((c.finish(), c.len));
        }
        c.update(&buf[..n]);
    }
}

/// Reads one line (without the newline) byte by byte, so nothing after it is consumed.
pub async fn read_line(s: &mut TcpStream) -> std::io::Result<String> {
    let mut out = Vec::new();
    loop {
        let b = s.read_u8().await?;
        if b == b'\n' {
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        out.push(b);
    }
}

/// Connects to the relay port and returns the name the backend announced.
pub async fn name_via(port: u16) -> String {
    let mut s = TcpStream::connect(local(port)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), read_line(&mut s))
        .await
        .expect("no answer through the relay")
        .unwrap()
}

/// Sends `msg` and expects it echoed back.
pub async fn round_trip(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
        .await
        .expect("echo timed out")
        .unwrap();
    assert_eq!(back, msg);
}

/// A loopback address:port where nothing listens (connects are refused).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind(local(0)).unwrap();
    l.local_addr().unwrap()
    // `l` is dropped here: the port is closed.
}

/// A loopback endpoint whose accept queue is full, so the kernel drops new SYNs and connects
/// time out. Keep the value alive while it is used.
pub struct BlackHole {
    pub addr: SocketAddr,
    _listener: TcpListener,
    _fillers: Vec<TcpStream>,
}

impl BlackHole {
    pub async fn start() -> BlackHole {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(local(0)).unwrap();
        // Backlog 0: the queue holds one connection that is never accepted.
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fillers = Vec::new();
        // Fill the queue: connects complete until it is full, then hang.
        loop {
            match tokio::time::timeout(Duration::from_millis(100), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => fillers.push(s),
                Ok(Err(e)) => panic!("black hole refused a connect: {e}"),
                Err(_) => break,
            }
            assert!(
                fillers.len() < 16,
                "this kernel does not drop SYNs on a full queue"
            );
        }
        BlackHole {
            addr,
            _listener: listener,
            _fillers: fillers,
        }
    }
}

/// A UDP backend on 127.0.0.1 answering `name:` + the datagram, recording its peers.
pub struct UdpBackend {
    pub addr: SocketAddr,
    pub peers: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
    task: JoinHandle<()>,
}

impl Drop for UdpBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl UdpBackend {
    pub async fn start(name: &str) -> UdpBackend {
        let s = UdpSocket::bind(local(0)).await.unwrap();
        let addr = s.local_addr().unwrap();
        let peers: Arc<std::sync::Mutex<Vec<SocketAddr>>> = Arc::default();
        let seen = Arc::clone(&peers);
        let prefix = format!("{name}:").into_bytes();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            loop {
                let Ok((n, peer)) = s.recv_from(&mut buf).await else {
                    continue;
                };
                seen.lock().unwrap().push(peer);
                let mut reply = prefix.clone();
                reply.extend_from_slice(&buf[..n]);
                let _ = s.send_to(&reply, peer).await;
            }
        });
        UdpBackend { addr, peers, task }
    }
}

/// Sends `msg` from `client` to the relay port and returns the reply and who sent it.
pub async fn udp_ask(client: &UdpSocket, port: u16, msg: &[u8]) -> (Vec<u8>, SocketAddr) {
    client.send_to(msg, local(port)).await.unwrap();
    let mut buf = vec![0u8; 65536];
    let (n, from) = tokio::time::timeout(Duration::from_secs(2), client.recv_from(&mut buf))
        .await
        .expect("no UDP reply")
        .unwrap();
    buf.truncate(n);
    (buf, from)
}

/// Open file descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Polls `cond` every 10 ms for up to `within`; returns whether it became true.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the connection is closed by the peer (EOF or reset) within `within`.
pub async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Connects to the relay port and reports whether the relay closes the connection (EOF or
/// reset) within `within`. A reset may already fail the connect itself: the relay can accept
/// and reset before the client sees its connect complete.
pub async fn connect_and_see_closed(port: u16, within: Duration) -> bool {
    match TcpStream::connect(local(port)).await {
        Ok(mut s) => closed_within(&mut s, within).await,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}
