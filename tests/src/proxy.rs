//! A fault-injecting TCP proxy for fault tests: forwards a loopback port to
//! an upstream address, and delays every chunk the upstream sends back by a
//! delay the test can change while traffic flows (a slow Redis, say).
//! Runs on its own threads; dropping it stops accepting (connections
//! already open end when either side closes).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The running proxy.
#[derive(Debug)]
pub struct DelayProxy {
    /// The loopback address clients connect to.
    pub addr: SocketAddr,
    delay_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl DelayProxy {
    /// Listens on an ephemeral loopback port, forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let delay_us = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (delay, stopping) = (delay_us.clone(), stop.clone());
        std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                while !stopping.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let _ = client.set_nonblocking(false);
                            let _ = client.set_nodelay(true);
                            if let Ok(server) = TcpStream::connect(upstream) {
                                let _ = server.set_nodelay(true);
                                pipe(client, server, delay.clone());
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })?;
        Ok(Self {
            addr,
            delay_us,
            stop,
        })
    }

    /// Delays every chunk from the upstream by `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Release);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Copies client -> server as is, and server -> client after the delay.
fn pipe(client: TcpStream, server: TcpStream, delay_us: Arc<AtomicU64>) {
    let (Ok(client_read), Ok(server_write)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    std::thread::spawn(move || copy(client_read, server_write, None));
    std::thread::spawn(move || copy(server, client, Some(delay_us)));
}

fn copy(mut from: TcpStream, mut to: TcpStream, delay_us: Option<Arc<AtomicU64>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(delay) = &delay_us {
            let us = delay.load(Ordering::Acquire);
            if us > 0 {
                std::thread::sleep(Duration::from_micros(us));
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
