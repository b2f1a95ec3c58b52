//! A small HTTP/1.1 client with keep-alive connections, for the JSON
//! systems (the product's HTTP front end, the FastAPI service, the naive
//! model server): POST a body, read the status and the body
//! (`Content-Length` framing, which all three send).

use std::sync::Mutex;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Keep-alive connections to one `host:port`, reused across calls.
#[derive(Debug)]
pub struct HttpClient {
    addr: String,
    idle: Mutex<Vec<BufReader<TcpStream>>>,
}

impl HttpClient {
    pub fn new(addr: &str) -> Self {
        Self {
            addr: addr.to_string(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// POSTs `body` (JSON) to `path`; returns the response body of a 200.
    pub async fn post(&self, path: &str, body: &[u8]) -> anyhow::Result<Vec<u8>> {
        self.request("POST", path, body).await
    }

    /// GETs `path`; returns the response body of a 200.
    pub async fn get(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        self.request("GET", path, b"").await
    }

    /// One call. A pooled connection the server has closed meanwhile (an
    /// idle keep-alive timeout: uvicorn closes after 5 s) fails on first
    /// use; the call is then made once more on a fresh connection (every
    /// call of the benchmark is idempotent).
    async fn request(&self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Vec<u8>> {
        let pooled = self.idle.lock().unwrap().pop();
        let (status, response) = match pooled {
            Some(conn) => match self.exchange(conn, method, path, body).await {
                Ok(answer) => answer,
                Err(_) => {
                    self.exchange(self.connect().await?, method, path, body)
                        .await?
                }
            },
            None => {
                self.exchange(self.connect().await?, method, path, body)
                    .await?
            }
        };
        if status != 200 {
            bail!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&response).trim()
            );
        }
        Ok(response)
    }

    async fn connect(&self) -> anyhow::Result<BufReader<TcpStream>> {
        let stream = TcpStream::connect(&self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.addr))?;
        stream.set_nodelay(true)?;
        Ok(BufReader::new(stream))
    }

    /// Sends the request and reads the whole response: (status, body).
    async fn exchange(
        &self,
        mut conn: BufReader<TcpStream>,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        conn.get_mut().write_all(head.as_bytes()).await?;
        conn.get_mut().write_all(body).await?;
        // Status line and headers.
        let mut header = Vec::with_capacity(256);
        loop {
            let byte = conn.read_u8().await.context("reading the response")?;
            header.push(byte);
            if header.ends_with(b"\r\n\r\n") {
                break;
            }
            if header.len() > 64 << 10 {
                bail!("response headers over 64 KiB");
            }
        }
        let text = String::from_utf8_lossy(&header);
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("no status line")?;
        let length: usize = text
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .context("no Content-Length")?;
        let keep = !text.to_ascii_lowercase().contains("connection: close");
        let mut response = vec![0u8; length];
        conn.read_exact(&mut response).await?;
        if keep {
            self.idle.lock().unwrap().push(conn);
        }
        Ok((status, response))
    }
}
