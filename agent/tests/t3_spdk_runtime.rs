//! T3: the SPDK runtime's guarantees under faults: a panic on the reactor fails only its own
//! request, a request that never gets an answer times out (and an engine call with it)
//! without freezing the others, and requests racing `stop()` are each answered or refused.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures::executor::block_on;
use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
use liteio_agent::engine::{ErrorKind as EngineKind, PoolEngine};
use liteio_agent::exporter::{Exporter, ExporterHealth};
use liteio_agent::spdk::exporter::SpdkExporter;
use liteio_agent::spdk::nvmf::TcpTransportOptions;
use liteio_agent::spdk::runtime::{self, Reply, exec, on_reactor};
use liteio_agent::spdk::{ErrorKind, Spdk, SpdkError, SpdkOptions, bdev};

/// One SPDK runtime at a time in this process.
static SERIAL: Mutex<()> = Mutex::new(());

fn start(name: &str, timeout: Duration) -> Spdk {
    Spdk::start(&SpdkOptions {
        name: name.into(),
        request_timeout: timeout,
        ..SpdkOptions::small()
    })
    .expect("SPDK starts")
}

#[test]
fn a_panic_on_the_reactor_fails_its_request_and_spdk_goes_on() {
    let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let spdk = start("t3-panic", Duration::from_secs(10));
    let before = runtime::caught_panics();

    let e = block_on(on_reactor(|| -> liteio_agent::spdk::Result<()> {
        panic!("injected panic on the reactor")
    }))
    .unwrap_err();
    assert!(matches!(e, SpdkError::Panicked), "{e}");
    assert_eq!(e.kind(), ErrorKind::Engine);
    // A panic after the request started an SPDK operation, from a closure holding its reply.
    let e = block_on(exec(|reply: Reply<u32>| {
        let _keep = &reply;
        panic!("injected panic holding the reply")
    }))
    .unwrap_err();
    assert!(matches!(e, SpdkError::Panicked), "{e}");

    // The runtime keeps serving.
    assert_eq!(block_on(on_reactor(|| Ok(7))).unwrap(), 7);
    // Counted once caught (the reply went out while unwinding, before the count).
    assert_eq!(runtime::caught_panics(), before + 2);
    let b = block_on(bdev::create_malloc("panic_after", 4 << 20, 512)).unwrap();
    assert_eq!(b.size_bytes(), 4 << 20);
    block_on(bdev::delete_malloc("panic_after")).unwrap();
    spdk.stop();
}

/// Poll `f` until it holds, for at most `limit`.
fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn health(exporter: &SpdkExporter) -> ExporterHealth {
    block_on(exporter.health()).expect("health answers")
}

#[test]
fn a_request_without_an_answer_times_out_and_others_go_on() {
    let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let timeout = Duration::from_secs(1);
    let spdk = start("t3-timeout", timeout);
    let before = runtime::timed_out_requests();
    let observed = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&observed);
    assert!(runtime::set_stuck_observer(move || {
        seen.fetch_add(1, Ordering::SeqCst);
    }));
    let exporter = SpdkExporter::new("127.0.0.1", 4420..=4420, TcpTransportOptions::default());
    assert!(runtime::stuck_requests().is_empty());
    assert!(
        matches!(health(&exporter), ExporterHealth::Ok { .. }),
        "{:?}",
        health(&exporter)
    );
    let engine = SpdkLvsEngine::new(
        "to-lvs",
        BaseBdev::Malloc {
            name: "to-base".into(),
            size: 64 << 20,
        },
        0,
    );
    engine.ensure_pool().unwrap();

    // A completion that does not come in time (the reply is kept, as by an SPDK callback
    // that runs late): the caller gets Timeout, the request is listed as stuck and the
    // pool's health says so, naming the caller; the late answer clears it.
    let held: Arc<Mutex<Option<Reply<()>>>> = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&held);
    let t = Instant::now();
    let e = block_on(exec(move |reply: Reply<()>| {
        *keep.lock().unwrap() = Some(reply);
    }))
    .unwrap_err();
    let waited = t.elapsed();
    assert!(matches!(e, SpdkError::Timeout { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(
        e.to_string().contains("t3_spdk_runtime.rs"),
        "names the caller: {e}"
    );
    assert!(waited >= timeout && waited < timeout * 3, "{waited:?}");
    eprintln!("lost completion: {e} (after {waited:?})");
    let stuck = runtime::stuck_requests();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert!(stuck[0].request.contains("t3_spdk_runtime.rs"), "{stuck:?}");
    match health(&exporter) {
        ExporterHealth::Error { message } => {
            assert!(message.contains("1 SPDK request(s)"), "{message}");
            assert!(message.contains("t3_spdk_runtime.rs"), "{message}");
            eprintln!("pool condition while stuck: {message}");
        }
        h => panic!("a stuck request must make the pool unhealthy: {h:?}"),
    }
    assert!(
        observed.load(Ordering::SeqCst) >= 1,
        "the observer hears of it"
    );
    let heard = observed.load(Ordering::SeqCst);
    held.lock()
        .unwrap()
        .take()
        .expect("reply kept")
        .send(Ok(()));
    assert!(runtime::stuck_requests().is_empty());
    assert!(matches!(health(&exporter), ExporterHealth::Ok { .. }));
    assert!(
        observed.load(Ordering::SeqCst) > heard,
        "and of the late answer"
    );

    // A reactor parked until we let it go: the call times out after 1 s, and an engine
    // call meanwhile fails with an error naming the timeout instead of freezing.
    let (parked_tx, parked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let parked = std::thread::spawn(move || {
        block_on(on_reactor(move || {
            let _ = parked_tx.send(());
            let _ = release_rx.recv_timeout(Duration::from_secs(30));
            Ok(())
        }))
    });
    parked_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the reactor runs the parking request");
    let t = Instant::now();
    let e = engine.info().unwrap_err();
    assert_eq!(e.kind(), EngineKind::PoolUnavailable, "{e}");
    assert!(e.to_string().contains("no answer from SPDK"), "{e}");
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    let e = parked.join().unwrap().unwrap_err();
    assert!(matches!(e, SpdkError::Timeout { .. }), "{e}");
    // The parking request and the engine's both wait in SPDK now.
    eventually(Duration::from_secs(5), "two stuck requests", || {
        runtime::stuck_requests().len() == 2
    });
    assert!(runtime::timed_out_requests() >= before + 3);

    // Once the reactor is free, the late answers clear the list and everything works again.
    release_tx.send(()).unwrap();
    eventually(Duration::from_secs(10), "no stuck request", || {
        runtime::stuck_requests().is_empty()
    });
    assert_eq!(block_on(on_reactor(|| Ok(1))).unwrap(), 1);
    assert!(engine.info().unwrap().total_bytes > 0);
    assert!(matches!(health(&exporter), ExporterHealth::Ok { .. }));
    spdk.stop();
}

#[test]
fn requests_racing_stop_are_answered_or_refused() {
    let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    const MAX_ITERATIONS: u32 = 1000;
    // About 5 cycles a second here: 1,000 take some 3 minutes; the budget bounds a slow machine.
    const BUDGET: Duration = Duration::from_secs(300);
    const SENDERS: usize = 4;
    let (answered, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let other = Arc::new(Mutex::new(Vec::<String>::new()));
    let t = Instant::now();
    let mut iterations = 0;
    while iterations < MAX_ITERATIONS && t.elapsed() < BUDGET {
        let spdk = start("t3-stop-race", Duration::from_secs(10));
        let answered_before = answered.load(Ordering::Acquire);
        let done = Arc::new(AtomicBool::new(false));
        let senders: Vec<_> = (0..SENDERS)
            .map(|_| {
                let (done, answered, refused, other) = (
                    done.clone(),
                    answered.clone(),
                    refused.clone(),
                    other.clone(),
                );
                std::thread::spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        match block_on(on_reactor(|| Ok(()))) {
                            Ok(()) => answered.fetch_add(1, Ordering::Relaxed),
                            Err(SpdkError::NotRunning) => {
                                refused.fetch_add(1, Ordering::Relaxed);
                                std::thread::yield_now();
                                0
                            }
                            Err(e) => {
                                other.lock().unwrap().push(e.to_string());
                                0
                            }
                        };
                    }
                })
            })
            .collect();
        // Stop under the senders once they are getting answers.
        eventually(Duration::from_secs(10), "a first answer", || {
            answered.load(Ordering::Acquire) > answered_before
        });
        spdk.stop();
        done.store(true, Ordering::Release);
        for s in senders {
            s.join().expect("a sender panicked");
        }
        iterations += 1;
    }
    let (a, r) = (
        answered.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    let other = other.lock().unwrap();
    eprintln!(
        "stop race: {iterations} start/stop iterations in {:?}, {SENDERS} senders: {a} requests answered, {r} refused, {} otherwise",
        t.elapsed(),
        other.len()
    );
    assert!(other.is_empty(), "neither answered nor refused: {other:?}");
    assert!(
        iterations >= 100,
        "only {iterations} iterations in {BUDGET:?}"
    );
    assert!(a > 0 && r > 0, "{a} answered, {r} refused");
}

/// The nice value of this process's thread named `comm` (from /proc), if there is one.
fn thread_nice(comm: &str) -> Option<i64> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == comm))
        .map(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap();
            // Fields after the command name: state is field 3, nice field 19.
            let rest = stat.rsplit_once(") ").unwrap().1;
            rest.split_whitespace().nth(16).unwrap().parse().unwrap()
        })
}

#[test]
fn the_interrupt_mode_reactor_runs_ahead_of_the_other_threads() {
    let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    // Raising a priority needs CAP_SYS_NICE (root here).
    if std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1).is_none_or(|u| u != "0"))
    {
        println!("SKIP reactor priority: not root (raising a priority needs CAP_SYS_NICE)");
        return;
    }
    let spdk = Spdk::start(&SpdkOptions {
        name: "t3-nice".into(),
        reactor_nice: -7,
        ..SpdkOptions::small()
    })
    .expect("SPDK starts");
    assert_eq!(
        thread_nice("reactor_0"),
        Some(-7),
        "the reactor's nice value"
    );
    spdk.stop();
}

/// Pins the calling thread to `cpu` and gives it the nice value `nice` (lowering a priority
/// needs no privilege).
fn pin_and_nice(cpu: usize, nice: i32) {
    // SAFETY: cpu_set_t is a plain bit set; zeroed is empty. sched_setaffinity(0, …) and
    // setpriority on the calling thread's id only read their arguments.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
        let tid = libc::id_t::try_from(libc::gettid()).unwrap();
        assert_eq!(libc::setpriority(libc::PRIO_PROCESS, tid, nice), 0);
    }
}

/// A caller preempted while it hands its request over must not hold up the reactor. When
/// callers queued straight into SPDK's multi-producer message ring, the reactor, queueing a
/// message of its own to the same ring, spun until a preempted caller finished its enqueue:
/// provisioning bursts stalled 0.1–2.7 s. Here eight low-priority callers share the reactor's
/// CPU and are preempted at random points of their sends, while a probe on the other CPU
/// times a walk over SPDK's threads (the reactor queues a message to itself at each step).
#[test]
fn callers_preempted_while_sending_do_not_hold_up_the_reactor() {
    let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
        println!("SKIP preempted callers: needs 2 CPUs (the reactor's and the probe's)");
        return;
    }
    const CALLERS: usize = 8;
    const RUN: Duration = Duration::from_secs(6);
    // Without the request queue the longest walk here was 1.7 s, 9.7 s, or it timed out (10 s);
    // with it 12-36 ms, once 103 ms among 490,000 walks on a busy VM (its pauses).
    const LIMIT: Duration = Duration::from_millis(500);
    let spdk = start("t3-preempted", Duration::from_secs(10));
    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (done, sent) = (done.clone(), sent.clone());
            std::thread::spawn(move || {
                // The reactor's CPU (core mask 0x1), at a low priority: the reactor and
                // the probe's wake-ups preempt these threads wherever they are.
                pin_and_nice(0, 10);
                while !done.load(Ordering::Acquire) {
                    block_on(on_reactor(|| Ok(()))).expect("a caller's request");
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    pin_and_nice(1, 0);
    let t = Instant::now();
    let (mut walks, mut worst) = (0u64, Duration::ZERO);
    while t.elapsed() < RUN {
        let w = Instant::now();
        // A walk that times out (10 s) is the stall itself.
        block_on(liteio_agent::spdk::stats::threads()).expect("a walk over SPDK's threads");
        worst = worst.max(w.elapsed());
        walks += 1;
    }
    done.store(true, Ordering::Release);
    for c in callers {
        c.join().expect("a caller panicked");
    }
    spdk.stop();
    let sent = sent.load(Ordering::Relaxed);
    eprintln!(
        "preempted callers: {CALLERS} callers sent {sent} requests; {walks} walks, the longest {worst:?}"
    );
    assert!(
        worst < LIMIT,
        "a walk over SPDK's threads took {worst:?} while callers were preempted mid-send"
    );
    assert!(
        sent > 1000 && walks > 100,
        "too little traffic to tell: {sent} requests, {walks} walks"
    );
}
