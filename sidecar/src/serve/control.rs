//! The control loop: while `serve_threads` threads answer the ring, one
//! thread reacts to a closed set of [`Event`]s (a stop, a drain with its
//! reply, a damaged segment) and to a once-a-second tick that checks the
//! embedded store's directory. Nothing here polls a flag.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use crossbeam_channel::{select, Receiver};
use protocol::server::{RingServer, ServerOptions};

use crate::daemon::events::Event;
use crate::daemon::{Core, Daemon, DrainOutcome, Phase};
use crate::serve::batch;

/// How often the store's directory is checked.
const STORE_TICK: Duration = Duration::from_secs(1);

/// Why serving one ring ended.
enum Exit {
    Stopped,
    /// Another process truncated the segment file.
    Damaged,
}

/// The serving of the ring, from its creation to the stop.
pub(super) struct Control<'a> {
    pub daemon: &'a Daemon,
    pub core: &'a Core,
    pub runtime: &'a tokio::runtime::Handle,
    pub events: &'a Receiver<Event>,
    pub options: ServerOptions,
    /// The drain's outcome, once the ring was drained.
    drained: Option<DrainOutcome>,
}

impl<'a> Control<'a> {
    pub fn new(
        daemon: &'a Daemon,
        core: &'a Core,
        runtime: &'a tokio::runtime::Handle,
        events: &'a Receiver<Event>,
        options: ServerOptions,
    ) -> Self {
        Self {
            daemon,
            core,
            runtime,
            events,
            options,
            drained: None,
        }
    }

    /// Creates the ring (the sidecar is then ready) and serves it until
    /// the stop, replacing it whenever its segment is truncated. Returns
    /// the last ring, drained, for the caller to remove.
    pub fn run(mut self, server: RingServer) -> anyhow::Result<RingServer> {
        let mut server = server;
        loop {
            match self.serve_ring(&server)? {
                Exit::Stopped => break,
                Exit::Damaged => server = self.replace_ring(server)?,
            }
        }
        // Drains asked for while the stop drained get its outcome.
        let outcome = self.drained;
        for event in self.events.try_iter() {
            if let (Event::Drain(reply), Some(outcome)) = (event, outcome) {
                let _ = reply.send(outcome);
            }
        }
        Ok(server)
    }

    /// Creates a ring and installs its monitor (ready).
    pub fn create_ring(&self) -> anyhow::Result<RingServer> {
        let config = &self.daemon.config;
        let server = RingServer::create(self.options.clone())
            .with_context(|| format!("creating the shared-memory ring {}", config.shm_name))?;
        self.daemon.install_ring(server.monitor());
        Ok(server)
    }

    /// Serves `server` on the serving threads while this thread reacts to
    /// events, until the stop or a damaged segment.
    fn serve_ring(&mut self, server: &RingServer) -> anyhow::Result<Exit> {
        let serving = AtomicBool::new(true);
        let damage_reported = AtomicBool::new(false);
        std::thread::scope(|scope| -> anyhow::Result<Exit> {
            for i in 0..self.daemon.config.serve_threads {
                let (serving, damage_reported) = (&serving, &damage_reported);
                let (daemon, core, runtime) = (self.daemon, self.core, self.runtime);
                std::thread::Builder::new()
                    .name(format!("serve-{i}"))
                    .spawn_scoped(scope, move || {
                        let mut thread = ServeThread::new(daemon, core, runtime);
                        while serving.load(Ordering::Acquire) {
                            thread.serve_next(server, Duration::from_millis(100));
                            if server.damaged() && !damage_reported.swap(true, Ordering::AcqRel) {
                                daemon.post(Event::RingDamaged);
                            }
                        }
                    })
                    .context("starting a serving thread")?;
            }
            let exit = self.react(server);
            serving.store(false, Ordering::Release);
            Ok(exit)
        })
    }

    /// The event loop.
    fn react(&mut self, server: &RingServer) -> Exit {
        let tick = crossbeam_channel::tick(STORE_TICK);
        loop {
            let event = select! {
                recv(self.events) -> event => event.unwrap_or(Event::Stop),
                recv(tick) -> _ => {
                    self.check_store();
                    continue;
                }
            };
            match event {
                Event::Stop => {
                    if self.drained.is_none() {
                        self.drain(server);
                    }
                    return Exit::Stopped;
                }
                Event::Drain(reply) => {
                    let outcome = match self.drained {
                        Some(outcome) => outcome,
                        None => self.drain(server),
                    };
                    let _ = reply.send(outcome);
                }
                // A report about a ring already replaced is stale.
                Event::RingDamaged if server.damaged() => return Exit::Damaged,
                Event::RingDamaged => {}
            }
        }
    }

    /// Checks that the embedded store's directory is still there (the
    /// store alarms once when it is not).
    fn check_store(&self) {
        for store in self.core.features.stores() {
            store.directory_problem();
        }
    }

    /// The drain: the serving threads go on answering; this waits until no
    /// request is pending and the workers have finished every call they
    /// accepted before it began (or the drain timeout), reading the
    /// segment's counts (written by other processes: nothing to wait on).
    fn drain(&mut self, server: &RingServer) -> DrainOutcome {
        let daemon = self.daemon;
        let began = Instant::now();
        let answered_before = daemon.metrics.requests.get();
        server.set_draining();
        daemon.set_phase(Phase::Draining);
        let timeout = daemon.config.drain_timeout();
        let ring = server.monitor();
        while ring.unfinished() > 0 && began.elapsed() < timeout && !server.damaged() {
            std::thread::sleep(Duration::from_millis(2));
        }
        let pending = ring.unfinished();
        let outcome = DrainOutcome {
            answered: daemon.metrics.requests.get() - answered_before,
            pending,
            seconds: began.elapsed().as_secs_f64(),
            complete: pending == 0,
        };
        tracing::info!(
            answered = outcome.answered,
            pending = outcome.pending,
            seconds = outcome.seconds,
            "drained"
        );
        daemon.finish_drain(outcome);
        self.drained = Some(outcome);
        outcome
    }

    /// Another process truncated the segment file: every worker detaches
    /// from it (docs/protocol.md, section 1, Truncation). Retire it and
    /// create a new one under the same name; the workers attach to that by
    /// themselves.
    fn replace_ring(&self, old: RingServer) -> anyhow::Result<RingServer> {
        self.daemon.ring.retire();
        old.shutdown();
        let mut backoff = Duration::from_millis(50);
        let server = loop {
            match self.create_ring() {
                Ok(server) => break server,
                Err(e) if !self.daemon.stop_requested() => {
                    tracing::error!(error = %format!("{e:#}"), "cannot create a new ring; retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        };
        if self.drained.is_some() {
            server.set_draining();
        }
        tracing::warn!(
            segment = %self.daemon.config.shm_name,
            epoch = format_args!("{:#x}", server.segment().epoch()),
            "a new shared-memory ring replaces the truncated one"
        );
        Ok(server)
    }
}

/// One serving thread: its batch server (sampler buffers) and tickets. A
/// batch waiting for its rows blocks only its own thread.
struct ServeThread<'a> {
    daemon: &'a Daemon,
    core: &'a Core,
    runtime: &'a tokio::runtime::Handle,
    batch_server: batch::BatchServer,
    tickets: Vec<protocol::ServeTicket>,
}

impl<'a> ServeThread<'a> {
    fn new(daemon: &'a Daemon, core: &'a Core, runtime: &'a tokio::runtime::Handle) -> Self {
        Self {
            daemon,
            core,
            runtime,
            batch_server: batch::BatchServer::default(),
            tickets: Vec::new(),
        }
    }

    /// Takes what is submitted (waiting up to `wait`) and answers it as one
    /// batch, against the graph snapshot of that moment.
    fn serve_next(&mut self, server: &RingServer, wait: Duration) {
        let (daemon, core) = (self.daemon, self.core);
        daemon.loop_turned();
        self.tickets.clear();
        if server.next_batch(&mut self.tickets, wait) == 0 {
            return;
        }
        if let Some(why) = core.updates.as_ref().and_then(|u| u.stale()) {
            for ticket in self.tickets.drain(..) {
                let id = ticket.request_id();
                ticket.respond_error(protocol::layout::status::UNAVAILABLE, id, &why);
            }
            return;
        }
        // The change tick is read before the snapshot is loaded: a change
        // the snapshot holds may be newer than the tick, never older.
        let changes = core.graph.changes();
        let change_tick = changes.tick();
        let snapshot = core.graph.snapshot();
        let ctx = batch::BatchContext {
            graph: &snapshot,
            changes,
            change_tick,
            features: &core.features,
            runtime: self.runtime,
            knobs: &daemon.knobs,
            max_nodes: daemon.config.max_nodes,
            response_bytes: server.segment().geometry().response_bytes,
            metrics: &daemon.metrics,
        };
        let tickets = std::mem::take(&mut self.tickets);
        let batch_server = &mut self.batch_server;
        // A fault while serving one batch (a panic: a defect) answers that
        // batch's unanswered requests INTERNAL as their tickets drop, and
        // serving goes on with fresh scratch state: one bad request never
        // takes the daemon down with every other caller's.
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            batch_server.serve(&ctx, tickets)
        }));
        if served.is_err() {
            daemon.metrics.serve_faults.inc();
            tracing::error!(
                "a fault while serving a ring batch (the panic above): its unanswered requests \
                 were answered INTERNAL; serving goes on"
            );
            self.batch_server = batch::BatchServer::default();
        }
    }
}
