//! A hostile tenant against the real daemon (issue acceptance 9.5/9.d): a reproducible fuzz of
//! malformed requests over every route never gets a 5xx (except the documented 503s) and leaves
//! the daemon answering; and while scope A is fuzzed and attacked (the review's H1, H2, H3, M1, M2,
//! M3; the second review's N3, a zip of names that once collided), scope B keeps writing and reading through its FUSE mount and the HTTP API, every operation
//! succeeding within a stated latency bound. The same holds while scope A pushes each bound added
//! since the review (regex size, diff size, links, extended attributes, the quota charged by
//! `fallocate`, attributes and `O_TMPFILE`) one step past its value: each is refused with its
//! documented status or errno before the work is done (`hostile_support::bounds`).
//!
//! The daemon runs with small known bounds (see `hostile_support`), without a sandbox executor, and
//! with an 8 GiB address-space cap so an unbounded allocation aborts it rather than the machine.
//! Reproduce a fuzz failure with the printed seed and request index:
//! `HOSTILE_SEED=<seed> cargo test --workspace --test hostile_tenant -- --nocapture`.

pub mod hostile_support;
pub mod serve_process;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hostile_support::attacks::{self, Bystander, Verdict};
use hostile_support::bounds;
use hostile_support::fuzz::{self, Report, Route, Target};
use hostile_support::{Hostile, HMAC_SECRET, PEAK_RSS};

/// Requests of the full fuzz, and the most time it may take on this 2-core machine.
const FUZZ_COUNT: u64 = 10_000;
const FUZZ_MAX_TIME: Duration = Duration::from_secs(120);
/// Slowest bystander operation allowed. An unloaded operation takes milliseconds; 5 s on a
/// 2-core machine shared with the fuzz and the attacks still means "served", while a starved
/// worker pool, a full staging budget or a dead mount means failures or waits far beyond it.
const BYSTANDER_MAX_LATENCY: Duration = Duration::from_secs(5);
/// The quota of every scope (bytes, inodes) in the daemon of the bounds test: small, so scope A
/// fills it cheaply; roomy for the bystander's two 32 KiB files.
const BOUNDS_QUOTA: (u64, u64) = (16 * 1024 * 1024, 64);
/// The tests each start a daemon and load both cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Sets the flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn seed() -> u64 {
    std::env::var("HOSTILE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5c0_9ef5_2026)
}

fn print_report(name: &str, seed: u64, routes: &[Route], r: &Report) {
    eprintln!(
        "{name}: seed {seed}, {} requests in {:.1?}; answers {:?}; allowed 5xx {:?}; {} failures",
        r.sent, r.elapsed, r.by_class, r.allowed_5xx, r.failure_count
    );
    eprintln!("  answers by status and code: {:?}", r.by_code);
    for (i, label, what) in &r.failures {
        eprintln!("  request {i}: {label}: {what}");
    }
    let unhit: Vec<String> = routes
        .iter()
        .enumerate()
        .filter(|(i, _)| !r.per_route.contains_key(i))
        .map(|(_, rt)| format!("{} {}", rt.method, rt.path))
        .collect();
    if !unhit.is_empty() {
        eprintln!("  routes never sent: {unhit:?}");
    }
}

#[test]
fn fuzz_of_every_route_never_answers_5xx_and_the_daemon_survives() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let h = Hostile::start();
    let thread = "thr-fuzz";
    let scope = h.provision(thread);
    h.mountpoint(&scope);
    let routes = h.routes();
    // The route table is the one source of the router: every router it merges must be in it.
    for must in [
        "GET /health",
        "POST /internal/workspace-scopes/provision",
        "PATCH /internal/leases/{lock_name}",
        "PUT /api/workspace/file",
        "POST /api/workspace/upload",
        "POST /tools/edit_file",
        "POST /tools/execute_command",
        "PUT /admin/accounts/{user_id}/plan",
    ] {
        assert!(routes.iter().any(|r| format!("{} {}", r.method, r.path) == must), "route table lacks {must}");
    }
    assert!(routes.len() >= 48, "only {} routes in /openapi.json", routes.len());

    let target = Target {
        addr: h.addr,
        scope_id: scope.clone(),
        thread: thread.into(),
        secret: HMAC_SECRET.into(),
        blocking_leases: true,
    };
    let seed = seed();
    let alive = || h.unhealthy();
    let report = fuzz::run(seed, FUZZ_COUNT, FUZZ_MAX_TIME, 2, &routes, &target, &alive);
    print_report("fuzz", seed, &routes, &report);

    assert_eq!(report.stopped_early, None, "the daemon stopped answering during the fuzz");
    assert_eq!(h.unhealthy(), None, "the daemon is not healthy after the fuzz");
    assert_eq!(report.failure_count, 0, "unexpected 5xx answers or missing answers (listed above)");
    assert!(report.sent >= FUZZ_COUNT, "only {} requests within {FUZZ_MAX_TIME:?}", report.sent);
    for (i, rt) in routes.iter().enumerate() {
        assert!(
            report.per_route.get(&i).copied().unwrap_or(0) >= 20,
            "{} {} got fewer than 20 requests",
            rt.method,
            rt.path
        );
    }
    // Still serving real work afterwards.
    let again = h.provision("thr-after-fuzz");
    assert_eq!(again.len(), scope.len());
}

/// Runs `attack` while the bystander loop writes and reads scope B (`thread_b`, mounted at
/// `mnt_b`) and returns both results. The bystander is a detached thread that owns what it needs:
/// if it hangs on a stuck mount the test fails at the deadline here (and dropping the daemon
/// unsticks it) instead of hanging.
fn beside_bystander<T>(h: &Hostile, thread_b: &str, mnt_b: PathBuf, attack: impl FnOnce() -> T) -> (T, Bystander) {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let (base, thread, stop_b) = (h.serve.base.clone(), thread_b.to_string(), Arc::clone(&stop));
    std::thread::spawn(move || {
        let _ = tx.send(attacks::bystander(&base, &thread, mnt_b, &stop_b));
    });
    let out = {
        // Ends the bystander even if the attack panics.
        let _stop = StopOnDrop(&stop);
        attack()
    };
    let by = rx.recv_timeout(Duration::from_secs(120)).expect("the bystander hung (a stuck mount or request)");
    (out, by)
}

/// Prints the attacks' verdicts and what the bystander saw; the problems among them (failed
/// verdicts, failed or too slow bystander operations, an unhealthy daemon or a peak RSS over
/// [`PEAK_RSS`]).
fn problems_of(h: &Hostile, verdicts: &[Verdict], by: &Bystander) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, v) in verdicts {
        match v {
            Ok(what) => eprintln!("ok   {name}: {what}"),
            Err(why) => {
                eprintln!("FAIL {name}: {why}");
                problems.push(format!("{name}: {why}"));
            }
        }
    }
    let (p50, p99, max) = by.latencies.summary();
    eprintln!(
        "bystander: {} rounds, {} ops, p50 {p50:.1?}, p99 {p99:.1?}, max {max:.1?} (slowest {:?}), {} failures",
        by.rounds,
        by.latencies.0.len(),
        by.latencies.slowest(),
        by.failures.len()
    );
    for f in &by.failures {
        eprintln!("  {f}");
    }
    if !by.failures.is_empty() {
        problems.push(format!("bystander: {} failed operations, first: {}", by.failures.len(), by.failures[0]));
    }
    if max > BYSTANDER_MAX_LATENCY {
        problems.push(format!(
            "bystander: slowest op {:?} over the {BYSTANDER_MAX_LATENCY:?} bound",
            by.latencies.slowest()
        ));
    }
    if let Some(why) = h.unhealthy() {
        problems.push(format!("daemon after the attacks: {why}"));
    } else {
        let peak = h.peak_rss();
        // Every scope the run provisioned is mounted at most once.
        let (bound, per_scope) = h.memory_bound;
        let bound = bound + per_scope * h.mounted_scopes();
        eprintln!("daemon peak RSS {} MiB (configuration's memory bound {} MiB)", peak >> 20, bound >> 20);
        if peak > PEAK_RSS.min(bound) {
            problems.push(format!(
                "daemon peak RSS {} MiB over {} MiB (the configuration's bound {} MiB)",
                peak >> 20,
                PEAK_RSS.min(bound) >> 20,
                bound >> 20
            ));
        }
    }
    problems
}

/// Whether scope B's HTTP file reads back after the attacks (a fresh read), else why not.
fn bystander_file_problem(h: &Hostile, thread_b: &str) -> Option<String> {
    let r = h.client.get(h.url("/api/workspace/file")).query(&[("threadId", thread_b), ("path", "bystander-http.bin")]);
    match r.bearer_auth(hostile_support::SERVICE_TOKEN).send() {
        Ok(r) if r.status().is_success() => None,
        Ok(r) => Some(format!("scope B's file after the attacks: {}", r.status())),
        Err(e) => Some(format!("scope B's file after the attacks: {e}")),
    }
}

#[test]
fn bystander_scope_is_unaffected_while_scope_a_is_fuzzed_and_attacked() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let h = Hostile::start();
    let (thread_a, thread_b) = ("thr-attacker", "thr-bystander");
    let scope_a = h.provision(thread_a);
    let scope_b = h.provision(thread_b);
    let (mnt_a, mnt_b) = (h.mountpoint(&scope_a), h.mountpoint(&scope_b));
    let routes = h.routes();
    let target = Target {
        addr: h.addr,
        scope_id: scope_a.clone(),
        thread: thread_a.into(),
        secret: HMAC_SECRET.into(),
        blocking_leases: false,
    };
    let seed = seed() ^ 0xb5;
    let start = Instant::now();
    let ((verdicts, report), by) = beside_bystander(&h, thread_b, mnt_b, || {
        std::thread::scope(|s| {
            let fuzz = s.spawn(|| {
                let alive = || h.unhealthy();
                fuzz::run(seed, 1500, Duration::from_secs(60), 1, &routes, &target, &alive)
            });
            let verdicts: Vec<Verdict> = vec![
                attacks::m1_unauthenticated_giant_bodies(&h),
                attacks::h1_identical_sparse_blocks(&h, thread_a),
                attacks::h2_m3_patterns(&h, thread_a),
                attacks::h3_many_dir_handles(&mnt_a),
                attacks::m2_m3_deep_chain(&h, thread_a, &mnt_a),
                attacks::n3_zip_of_colliding_names(&h, thread_a, &mnt_a),
                attacks::n2_listing_bomb(&h, thread_a, &mnt_a),
                attacks::n6_sparse_files_held_open(&mnt_a),
                hostile_support::tools_flood::n5_tools_flood(&h),
            ];
            (verdicts, fuzz.join().unwrap())
        })
    });

    eprintln!("attack phase took {:.1?}", start.elapsed());
    print_report("fuzz of scope A", seed, &routes, &report);
    let mut problems = problems_of(&h, &verdicts, &by);
    if report.failure_count > 0 || report.stopped_early.is_some() {
        problems.push(format!("fuzz: {} failures, stopped early: {:?}", report.failure_count, report.stopped_early));
    }
    problems.extend(bystander_file_problem(&h, thread_b));
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// The bounds added after the review (see `hostile_support::bounds`), each pushed past its small
/// configured value by scope A through the tools and its FUSE mount, in a daemon whose scopes have
/// a small quota so filling it is cheap; scope B keeps working meanwhile.
#[test]
fn recent_bounds_refuse_before_the_work_while_the_bystander_works() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let h = Hostile::with_quota(BOUNDS_QUOTA);
    let (thread_a, thread_b) = ("thr-bounds", "thr-bounds-bystander");
    let scope_a = h.provision(thread_a);
    let scope_b = h.provision(thread_b);
    let (mnt_a, mnt_b) = (h.mountpoint(&scope_a), h.mountpoint(&scope_b));
    // A file held open and rewritten, in a scope of its own: A's quota is full by then.
    let scope_c = h.provision("thr-bounds-open-log");
    let mnt_c = h.mountpoint(&scope_c);
    let (verdicts, by) = beside_bystander(&h, thread_b, mnt_b, || {
        // The byte quota first: it reads the scope's usage, which later FUSE writes change only
        // once the kernel releases their files.
        vec![
            bounds::grep_regex(&h, thread_a),
            bounds::edit_diff(&h, thread_a),
            bounds::quota_bytes(&h, thread_a, &mnt_a),
            bounds::hard_links(&h, &mnt_a),
            bounds::xattrs(&h, &mnt_a),
            bounds::tmpfile_inodes(&mnt_a),
            bounds::tools_body_memory(&h),
            bounds::tools_answer_memory(&h),
            bounds::tools_answer_share(&h),
            bounds::open_log(&h, &scope_c, &mnt_c),
        ]
    });
    let mut problems = problems_of(&h, &verdicts, &by);
    problems.extend(bystander_file_problem(&h, thread_b));
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}
