//! A worker-side process for tests: attaches, makes `--hold` calls and keeps
//! their responses (so it owns that many PUBLISHED slots), prints
//! `HOLDING <client epoch>`, then waits to be killed. Used to prove that the
//! sidecar reclaims the slots of a worker that died.
#![forbid(unsafe_code)]

use std::time::Duration;

use clap::Parser;
use protocol::{CallRequest, ClientOptions, RingClient};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    name: String,
    #[arg(long, default_value_t = 3)]
    hold: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = RingClient::attach(&args.name, ClientOptions::default())?;
    let mut held = Vec::new();
    for i in 0..args.hold {
        let targets = [i as u64 + 1];
        let mut request = CallRequest::new(&targets);
        request.timeout = Some(Duration::from_secs(5));
        held.push(client.call(&request)?);
    }
    println!("HOLDING {}", held.len());
    loop {
        std::thread::park();
    }
}
