//! `otlp-receiver <addr>`: an OTLP/gRPC receiver ([`tests::otlp`]) that
//! prints how many spans it has received, once a second, until killed.
//! For the trace-overhead benchmark (docs/operations.md, "Traces").

fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4317".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (receiver, endpoint, _server) = tests::otlp::Receiver::serve(&addr).await?;
        println!("listening {endpoint}");
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            println!("spans {}", receiver.count());
        }
    })
}
