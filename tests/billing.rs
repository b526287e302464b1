//! Compute billing acceptance (issue 5 a–e): preflight boundaries, settlement arithmetic and
//! rollback, two concurrent settlers, `kill -9` during the settlement loop, artifact retries.

pub mod serve_process;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use scopefs::billing::{
    self, run_pending_pass, AccountBalance, ArtifactRegistrar, BillingError, Micros, PassSettings, PlanConfig,
    PricingConfig, RecordOnlyRegistrar,
};
use scopefs::clock::ManualClock;
use scopefs::registry::billing::{ArtifactsState, SettleStatus, UsageRecord};
use scopefs::registry::{test_backend, Registry};
use serve_process::{ServeProcess, BIN};

fn m(s: &str) -> Micros {
    Micros::parse(s).unwrap()
}

/// Default pricing plus `payg` (compute, no free minutes) and `tiny` (2 free minutes, 1 h max).
fn pricing() -> PricingConfig {
    let mut p = PricingConfig::default();
    p.plans.insert(
        "payg".into(),
        PlanConfig { compute_allowed: true, monthly_minutes: 0, hard_max_runtime_seconds: 7200 },
    );
    p.plans.insert(
        "tiny".into(),
        PlanConfig { compute_allowed: true, monthly_minutes: 2, hard_max_runtime_seconds: 3600 },
    );
    p.validate().unwrap();
    p
}

/// An account on `plan` with `cash` credited.
fn account(reg: &Registry, p: &PricingConfig, user: &str, plan: &str, cash: &str) {
    reg.set_plan(p, user, plan).unwrap();
    if Micros::parse(cash).unwrap().is_positive() {
        reg.credit_cash(p, user, m(cash), &format!("seed-{user}"), None).unwrap();
    }
}

fn assert_books_agree(reg: &Registry) -> scopefs::registry::billing::BillingAudit {
    let audit = reg.billing_audit().unwrap();
    assert!(audit.problems.is_empty(), "books disagree: {:#?}", audit.problems);
    audit
}

// ---------- a: preflight boundaries (seed 003 §10.1) ----------

#[test]
fn a_preflight_boundaries() {
    let reg = Registry::open_for_tests().unwrap();
    let p = pricing();

    // Starter: never, whatever the balance.
    account(&reg, &p, "starter_rich", "starter", "500.000000");
    let pre = reg.compute_preflight(&p, "starter_rich", Some(600)).unwrap();
    assert!(!pre.quota_ok);
    assert!(matches!(reg.admit_environment(&p, "starter_rich", Some(600)), Err(BillingError::ComputeQuotaExceeded(_))));
    // A user never seen gets the default plan (starter): refused.
    assert!(matches!(reg.admit_environment(&p, "newcomer", None), Err(BillingError::ComputeQuotaExceeded(_))));

    // Zero minutes, cash for exactly one minute: allowed for 60 s.
    account(&reg, &p, "one_minute", "payg", "0.050000");
    let pre = reg.compute_preflight(&p, "one_minute", Some(3600)).unwrap();
    assert!(pre.quota_ok);
    assert_eq!((pre.affordable_runtime_seconds, pre.effective_max_runtime_seconds), (60, 60));
    assert_eq!(reg.admit_environment(&p, "one_minute", Some(3600)).unwrap(), 60);

    // Zero minutes with cash: floor(cash / price) minutes.
    account(&reg, &p, "cash_only", "payg", "1.020000");
    let pre = reg.compute_preflight(&p, "cash_only", None).unwrap();
    assert_eq!((pre.quota_ok, pre.affordable_runtime_seconds), (true, 20 * 60));
    assert_eq!(pre.effective_max_runtime_seconds, 1200);

    // Less than one minute affordable: refused (429).
    account(&reg, &p, "almost", "payg", "0.049999");
    let pre = reg.compute_preflight(&p, "almost", Some(60)).unwrap();
    assert!(!pre.quota_ok);
    assert_eq!(pre.affordable_runtime_seconds, 0);
    assert!(matches!(reg.admit_environment(&p, "almost", Some(60)), Err(BillingError::ComputeQuotaExceeded(_))));
    account(&reg, &p, "broke", "payg", "0");
    assert!(!reg.compute_preflight(&p, "broke", None).unwrap().quota_ok);

    // Clamp to the plan maximum; and to the affordable runtime.
    account(&reg, &p, "pro_user", "pro", "10.000000");
    let pre = reg.compute_preflight(&p, "pro_user", Some(100_000)).unwrap();
    assert_eq!(pre.affordable_runtime_seconds, (120 + 200) * 60);
    assert_eq!(pre.effective_max_runtime_seconds, 7200);
    assert_eq!(reg.compute_preflight(&p, "pro_user", None).unwrap().effective_max_runtime_seconds, 7200);
    assert_eq!(reg.compute_preflight(&p, "pro_user", Some(90)).unwrap().effective_max_runtime_seconds, 90);
    account(&reg, &p, "tiny_user", "tiny", "0.100000");
    assert_eq!(reg.admit_environment(&p, "tiny_user", Some(3600)).unwrap(), (2 + 2) * 60);
    // A request under a minute is below the admission floor.
    assert!(matches!(reg.admit_environment(&p, "pro_user", Some(59)), Err(BillingError::ComputeQuotaExceeded(_))));

    // Negative values (a corrupted or migrated balance): quota_ok = false, nothing affordable.
    let pro = p.plan("pro").unwrap();
    let neg_minutes = AccountBalance { plan: "pro".into(), compute_minutes_remaining: -1, cash_balance: m("100") };
    let pre = billing::preflight(&neg_minutes, pro, p.overtime_price_per_minute, Some(600));
    assert_eq!((pre.quota_ok, pre.affordable_runtime_seconds, pre.effective_max_runtime_seconds), (false, 0, 0));
    let neg_cash = AccountBalance { plan: "pro".into(), compute_minutes_remaining: 50, cash_balance: m("-0.000001") };
    let pre = billing::preflight(&neg_cash, pro, p.overtime_price_per_minute, Some(600));
    assert_eq!((pre.quota_ok, pre.affordable_runtime_seconds), (false, 0));
    // Negative money is refused as an input.
    assert!(reg.credit_cash(&p, "pro_user", m("-1"), "neg", None).is_err());
    assert!(reg.credit_cash(&p, "pro_user", Micros::ZERO, "zero", None).is_err());
    assert!(Micros::parse("0.0000001").is_err());
}

/// Review M7: the preflight counts what the user already committed, across scopes: the admitted
/// runtime of live environments and usage not settled yet. Parallel environments cannot together
/// run longer than the balance pays for.
#[test]
fn a_preflight_counts_live_environments_and_unsettled_usage_of_the_user() {
    use scopefs::ids::ThreadId;
    use scopefs::registry::environments::NewEnvironment;
    let reg = std::sync::Arc::new(Registry::open_for_tests().unwrap());
    let dep = reg.deployment("d");
    let p = pricing();
    let scope = |t: &str| {
        let pr = dep.provision(&format!("op-{t}"), &ThreadId::parse(t).unwrap(), None).unwrap();
        dep.complete_provision(&pr.scope.scope_id).unwrap().scope_id
    };
    let live = |scope: &scopefs::ids::ScopeId, user: &str, secs: u64| {
        let new = NewEnvironment {
            user_id: user.into(),
            thread_id: "t".into(),
            read_only: false,
            requested_max_runtime_seconds: Some(secs),
            effective_max_runtime_seconds: secs,
            max_live_per_scope: 4,
            pricing_snapshot: None,
        };
        dep.create_environment(scope, &new).unwrap().unwrap().environment_id
    };
    let (a, b) = (scope("thr-a"), scope("thr-b"));
    // 120 free minutes, no cash: one hour in scope A, one hour in scope B, then nothing.
    account(&reg, &p, "para", "pro", "0");
    assert_eq!(reg.admit_environment(&p, "para", Some(3600)).unwrap(), 3600);
    let first = live(&a, "para", 3600);
    assert_eq!(reg.admit_environment(&p, "para", None).unwrap(), 3600, "60 minutes are committed in scope A");
    live(&b, "para", 3600);
    assert!(matches!(reg.admit_environment(&p, "para", None), Err(BillingError::ComputeQuotaExceeded(_))));
    // Another user's budget is their own.
    account(&reg, &p, "other", "pro", "0");
    assert_eq!(reg.admit_environment(&p, "other", None).unwrap(), 7200);

    // The first ends after 30 minutes: its usage is unpaid until settled, and still counts.
    dep.end_environment(&first, false, "destroyed").unwrap();
    let usage = reg.record_usage("para", "t", &first, 1800, &[]).unwrap();
    assert_eq!(reg.admit_environment(&p, "para", None).unwrap(), 1800, "120 - 60 live - 30 unsettled");
    reg.settle_usage(&p, usage.usage_id).unwrap();
    assert_eq!(reg.account("para").unwrap().unwrap().compute_minutes_remaining, 90);
    assert_eq!(reg.admit_environment(&p, "para", None).unwrap(), 1800, "90 - 60 live");

    // Cash pays what free minutes do not: 0 minutes, cash for 60; 40 committed leave 20.
    account(&reg, &p, "payer", "payg", "3.000000");
    live(&a, "payer", 2400);
    let pre = reg.compute_preflight(&p, "payer", None).unwrap();
    assert_eq!((pre.affordable_runtime_seconds, pre.cash_balance_snapshot), (20 * 60, m("1.000000")));
    live(&b, "payer", 1200);
    assert!(matches!(reg.admit_environment(&p, "payer", None), Err(BillingError::ComputeQuotaExceeded(_))));
    assert_books_agree(&reg);
}

// ---------- b: settlement arithmetic, rollback, already_settled ----------

fn ledger_len(reg: &Registry, user: &str) -> usize {
    reg.ledger(user, 1000, None).unwrap().len()
}

#[test]
fn b_settlement_minutes_cash_mixed_insufficient_and_already_settled() {
    let reg = Registry::open_for_tests().unwrap();
    let p = pricing();

    // Minutes only: 61 s → 2 minutes from the 120 free ones, ledger row of 0.
    account(&reg, &p, "u_min", "pro", "1.000000");
    let u = reg.record_usage("u_min", "t1", "env_min", 61, &[]).unwrap();
    assert_eq!(u.compute_minutes, 2);
    let s = reg.settle_usage(&p, u.usage_id).unwrap();
    assert_eq!(s.status, SettleStatus::Settled);
    let a = reg.account("u_min").unwrap().unwrap();
    assert_eq!((a.compute_minutes_remaining, a.cash_balance, a.compute_minutes_used), (118, m("1.000000"), 2));
    let entry = &reg.ledger("u_min", 10, None).unwrap()[0];
    assert_eq!((entry.idempotency_key.as_str(), entry.amount), ("compute:u_min:t1:env_min", Micros::ZERO));
    assert_eq!((entry.compute_minutes, entry.free_minutes), (Some(2), Some(2)));

    // Cash only: 180 s = 3 minutes at 0.05 = 0.150000.
    account(&reg, &p, "u_cash", "payg", "1.000000");
    let u = reg.record_usage("u_cash", "t2", "env_cash", 180, &[]).unwrap();
    reg.settle_usage(&p, u.usage_id).unwrap();
    let a = reg.account("u_cash").unwrap().unwrap();
    assert_eq!(
        (a.cash_balance, a.compute_overtime_charged, a.compute_minutes_remaining),
        (m("0.850000"), m("0.150000"), 0)
    );
    let u = reg.usage(u.usage_id).unwrap().unwrap();
    assert_eq!((u.free_minutes, u.overtime_minutes, u.overtime_charged), (Some(0), Some(3), Some(m("0.150000"))));
    assert_eq!(reg.ledger("u_cash", 1, None).unwrap()[0].balance_after, m("0.850000"));

    // Mixed: 2 free minutes, 241 s = 5 minutes → 3 overtime = 0.150000.
    account(&reg, &p, "u_mix", "tiny", "0.200000");
    let u = reg.record_usage("u_mix", "t3", "env_mix", 241, &[]).unwrap();
    reg.settle_usage(&p, u.usage_id).unwrap();
    let a = reg.account("u_mix").unwrap().unwrap();
    assert_eq!((a.compute_minutes_remaining, a.cash_balance, a.compute_minutes_used), (0, m("0.050000"), 5));
    assert_eq!(reg.usage(u.usage_id).unwrap().unwrap().quota_remaining, Some(0));

    // Insufficient: 2 minutes needs 0.10 but only 0.05 is left → nothing changes, usage pending.
    let before = reg.account("u_mix").unwrap().unwrap();
    let ledger_before = ledger_len(&reg, "u_mix");
    let u = reg.record_usage("u_mix", "t3", "env_poor", 120, &[]).unwrap();
    match reg.settle_usage(&p, u.usage_id) {
        Err(BillingError::InsufficientComputeBalance { needed, available }) => {
            assert_eq!((needed, available), (m("0.100000"), m("0.050000")))
        }
        other => panic!("expected InsufficientComputeBalance, got {other:?}"),
    }
    assert_eq!(reg.account("u_mix").unwrap().unwrap(), before);
    assert_eq!(ledger_len(&reg, "u_mix"), ledger_before);
    let pending = reg.usage(u.usage_id).unwrap().unwrap();
    assert_eq!((pending.settlement_status.as_str(), pending.ledger_entry_id), ("pending", None));
    // An account created by the failed settlement is rolled back too.
    let u_new = reg.record_usage("ghost", "t9", "env_ghost", 60, &[]).unwrap();
    assert!(matches!(reg.settle_usage(&p, u_new.usage_id), Err(BillingError::InsufficientComputeBalance { .. })));
    assert!(reg.account("ghost").unwrap().is_none());

    // After a credit it settles exactly once; settling again is already_settled with no second charge.
    reg.credit_cash(&p, "u_mix", m("0.050000"), "topup-1", Some("top-up")).unwrap();
    assert_eq!(reg.settle_usage(&p, u.usage_id).unwrap().status, SettleStatus::Settled);
    let after = reg.account("u_mix").unwrap().unwrap();
    assert_eq!(after.cash_balance, Micros::ZERO);
    for _ in 0..3 {
        assert_eq!(reg.settle_usage(&p, u.usage_id).unwrap().status, SettleStatus::AlreadySettled);
    }
    assert_eq!(reg.account("u_mix").unwrap().unwrap(), after);
    assert_eq!(ledger_len(&reg, "u_mix"), ledger_before + 2);

    // Recording the same environment again changes nothing; crediting with the same key is idempotent.
    let again = reg.record_usage("u_mix", "t3", "env_poor", 9999, &[]).unwrap();
    assert_eq!((again.usage_id, again.compute_minutes, again.is_settled()), (u.usage_id, 2, true));
    reg.credit_cash(&p, "u_mix", m("0.050000"), "topup-1", None).unwrap();
    assert_eq!(reg.account("u_mix").unwrap().unwrap().cash_balance, Micros::ZERO);
    assert!(matches!(reg.credit_cash(&p, "u_mix", m("0.060000"), "topup-1", None), Err(BillingError::CreditConflict)));
    assert_books_agree(&reg);
}

/// Issue 24, item 5 (`[billing] mode = "report"`): a record the gateway settled is marked
/// `reported` once, with no charge and no ledger row; the daemon's own settlement then finds it
/// settled (it never charges it), pending artifacts are refused first, and the books agree.
#[test]
fn reported_usage_is_marked_once_and_never_charged() {
    let reg = Registry::open_for_tests().unwrap();
    let p = pricing();
    account(&reg, &p, "u_rep", "payg", "1.000000");
    let (before, ledger_before) = (reg.account("u_rep").unwrap().unwrap(), ledger_len(&reg, "u_rep"));
    let u = reg.record_usage("u_rep", "t1", "env_rep", 180, &[]).unwrap();
    let first = reg.mark_usage_reported(u.usage_id).unwrap();
    assert_eq!((first.status, first.usage.settlement_status.as_str()), (SettleStatus::Settled, "reported"));
    assert!(first.usage.is_settled() && first.usage.settled_at.is_some() && first.usage.ledger_entry_id.is_none());
    for _ in 0..2 {
        assert_eq!(reg.mark_usage_reported(u.usage_id).unwrap().status, SettleStatus::AlreadySettled);
        assert_eq!(reg.settle_usage(&p, u.usage_id).unwrap().status, SettleStatus::AlreadySettled);
    }
    assert_eq!(reg.account("u_rep").unwrap().unwrap(), before, "nothing charged");
    assert_eq!(ledger_len(&reg, "u_rep"), ledger_before, "no ledger row");
    assert!(reg.pending_usage(100, false).unwrap().iter().all(|r| r.usage_id != u.usage_id));
    assert!(reg.usage_by_state(true, 100).unwrap().iter().any(|r| r.usage_id == u.usage_id), "listed as settled");
    // A record settled here first is already settled for the gateway too (one charge in all).
    let charged = reg.record_usage("u_rep", "t1", "env_charged", 60, &[]).unwrap();
    assert_eq!(reg.settle_usage(&p, charged.usage_id).unwrap().status, SettleStatus::Settled);
    assert_eq!(reg.mark_usage_reported(charged.usage_id).unwrap().status, SettleStatus::AlreadySettled);
    assert_eq!(ledger_len(&reg, "u_rep"), ledger_before + 1);
    let pending = reg.record_usage("u_rep", "t1", "env_outputs", 60, &["/workspace/a.txt".to_string()]).unwrap();
    assert!(matches!(reg.mark_usage_reported(pending.usage_id), Err(BillingError::ArtifactsPending)));
    reg.mark_artifacts_registered(&[pending.usage_id]).unwrap();
    assert_eq!(reg.mark_usage_reported(pending.usage_id).unwrap().status, SettleStatus::Settled);
    assert!(matches!(reg.mark_usage_reported(999_999), Err(BillingError::UsageNotFound)));
    assert_books_agree(&reg);
}

#[test]
fn monthly_quota_refresh_follows_the_injected_clock() {
    let clock = Arc::new(ManualClock::new(1_779_537_600_000)); // 2026-05-23
    let reg = Registry::open_for_tests().unwrap().with_clock(clock.clone());
    let p = pricing();
    account(&reg, &p, "q", "pro", "0");
    let u = reg.record_usage("q", "t", "env_q", 600, &[]).unwrap();
    reg.settle_usage(&p, u.usage_id).unwrap();
    assert_eq!(reg.account("q").unwrap().unwrap().compute_minutes_remaining, 110);
    assert_eq!(reg.refresh_compute_quotas(&p).unwrap(), 0);
    clock.set_ms(1_780_272_000_000); // 2026-06-01T00:00Z
    assert_eq!(reg.refresh_compute_quotas(&p).unwrap(), 1);
    let a = reg.account("q").unwrap().unwrap();
    assert_eq!((a.compute_minutes_remaining, a.compute_minutes_used, a.compute_minutes_lifetime), (120, 0, 10));
    assert_eq!(a.compute_quota_period_start, 1_780_272_000_000);
    assert_eq!(reg.refresh_compute_quotas(&p).unwrap(), 0);
    assert_books_agree(&reg);
}

// ---------- c: two settlers at once over 1,000 usage records ----------

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 1,000 usage records over 10 users on mixed plans, some of whom cannot pay for everything.
fn populate(reg: &Registry, p: &PricingConfig, cash_for_poor: &str) -> Vec<String> {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let users: Vec<String> = (0..10).map(|i| format!("user{i}")).collect();
    for (i, u) in users.iter().enumerate() {
        let plan = ["pro", "payg", "tiny"][i % 3];
        let cash = if i % 4 == 3 { cash_for_poor } else { "900.000000" };
        account(reg, p, u, plan, cash);
    }
    for n in 0..1000 {
        let u = &users[rng.below(users.len() as u64) as usize];
        let runtime = rng.below(1800);
        reg.record_usage(u, &format!("thread{}", n % 37), &format!("env_{n:04}"), runtime, &[]).unwrap();
    }
    users
}

/// Runs passes until a round makes no progress; returns how many records this settler settled.
fn settle_until_idle(reg: &Registry, p: &PricingConfig) -> usize {
    let settings = PassSettings { batch_size: 50, ..PassSettings::default() };
    let mut settled = 0;
    let mut idle = 0;
    while idle < 3 {
        let r = run_pending_pass(reg, p, &RecordOnlyRegistrar, &settings).unwrap();
        settled += r.settled;
        idle = if r.progressed() { 0 } else { idle + 1 };
    }
    settled
}

#[test]
fn c_two_concurrent_settlers_charge_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = test_backend::new_place(dir.path());
    let p = pricing();
    let reg = test_backend::open_place(&path).unwrap();
    let users = populate(&reg, &p, "1.000000");

    let run = |path: String, p: PricingConfig| {
        std::thread::spawn(move || {
            let reg = test_backend::open_place(&path).unwrap();
            settle_until_idle(&reg, &p)
        })
    };
    let (t1, t2) = (run(path.clone(), p.clone()), run(path.clone(), p.clone()));
    let settled_by_threads = t1.join().unwrap() + t2.join().unwrap();

    let audit = assert_books_agree(&reg);
    // Every `Settled` answer was exactly one charge: no record was settled by both settlers.
    assert_eq!(settled_by_threads, audit.settled_usages);
    assert_eq!(audit.settled_usages, audit.compute_ledger_rows);
    let pending = reg.pending_usage(2000, false).unwrap();
    assert!(!pending.is_empty() && audit.settled_usages + pending.len() == 1000, "some users must run out of cash");
    assert!(pending.iter().all(|u| u.settlement_error.as_deref() == Some("insufficient_compute_balance")));

    // Independent recomputation per user from the usage log.
    for u in &users {
        let a = reg.account(u).unwrap().unwrap();
        let ledger = reg.ledger(u, 5000, None).unwrap();
        let debits: i64 = ledger.iter().filter(|e| e.direction == "debit").map(|e| e.amount.micros()).sum();
        let credits: i64 = ledger.iter().filter(|e| e.direction == "credit").map(|e| e.amount.micros()).sum();
        assert_eq!(a.cash_balance.micros(), credits - debits, "{u}");
        assert!(a.compute_minutes_remaining >= 0 && a.cash_balance.micros() >= 0, "{u}");
    }

    // Money arrives: both settlers finish the rest, still exactly once.
    for u in &users {
        reg.credit_cash(&p, u, m("900.000000"), "second-topup", None).unwrap();
    }
    let (t1, t2) = (run(path.clone(), p.clone()), run(path.clone(), p.clone()));
    let more = t1.join().unwrap() + t2.join().unwrap();
    let audit2 = assert_books_agree(&reg);
    assert_eq!(audit2.settled_usages, 1000);
    assert_eq!(audit.settled_usages + more, 1000);
}

// ---------- d: kill -9 during the settlement loop, then restart ----------

const CHILD_DB: &str = "SCOPEFS_BILLING_TEST_CHILD_DB";

/// Not a test on its own: the body of the child process of `d_*`, run by `spawn_child`.
#[test]
#[ignore = "spawned by d_kill_during_settlement_leaves_no_half_settlement"]
fn child_settler_process() {
    let path =
        std::env::var_os(CHILD_DB).unwrap_or_else(|| panic!("{CHILD_DB} is not set: this test is spawned by d_*"));
    let reg = test_backend::open_place(&path.to_string_lossy()).unwrap();
    let p = pricing();
    let settings = PassSettings { batch_size: 50, ..PassSettings::default() };
    loop {
        let r = run_pending_pass(&reg, &p, &RecordOnlyRegistrar, &settings).unwrap();
        if r.listed == 0 {
            return;
        }
    }
}

fn spawn_child(path: &str, failpoint: Option<&str>) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", "child_settler_process", "--nocapture", "--test-threads=1"])
        .env(CHILD_DB, path)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match failpoint {
        Some(f) => cmd.env("SCOPEFS_FAILPOINT", f),
        None => cmd.env_remove("SCOPEFS_FAILPOINT"),
    };
    cmd.spawn().unwrap()
}

fn settled_count(reg: &Registry) -> usize {
    1000 - reg.pending_usage(2000, false).unwrap().len()
}

#[test]
fn d_kill_during_settlement_leaves_no_half_settlement() {
    let dir = tempfile::tempdir().unwrap();
    let path = test_backend::new_place(dir.path());
    let p = pricing();
    let reg = test_backend::open_place(&path).unwrap();
    populate(&reg, &p, "900.000000");

    // A failpoint between the charge and the ledger row: the process aborts inside the transaction.
    for fp in ["billing_settle_after_charge", "billing_settle_after_ledger"] {
        let status = spawn_child(&path, Some(fp)).wait().unwrap();
        assert!(!status.success(), "the child must have aborted at {fp}");
        assert_books_agree(&reg);
        assert_eq!(settled_count(&reg), 0, "nothing may be settled by an aborted transaction ({fp})");
    }

    // Random kills: SIGKILL at different points of the loop, three times, then let it finish.
    let mut rng = Rng(0x00c0_ffee_0bad_f00d ^ u64::from(std::process::id()));
    let mut kills_mid_way = 0;
    for round in 0..3 {
        let before = settled_count(&reg);
        let target = before + 20 + rng.below(150) as usize;
        let mut child = spawn_child(&path, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        while settled_count(&reg) < target && Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let after = settled_count(&reg);
        if after < 1000 {
            kills_mid_way += 1;
        }
        assert!(after >= before, "round {round}");
        assert_books_agree(&reg);
    }
    assert!(kills_mid_way > 0, "no kill landed before the loop finished");

    // Restart: the loop finishes the rest; every record charged exactly once.
    let status = spawn_child(&path, None).wait().unwrap();
    assert!(status.success());
    let audit = assert_books_agree(&reg);
    assert_eq!((audit.settled_usages, audit.compute_ledger_rows), (1000, 1000));
}

// ---------- e: artifact registration failing ----------

/// Fails the first `fail_first` calls (u32::MAX: always).
struct FlakyRegistrar {
    calls: AtomicU32,
    fail_first: u32,
}

impl ArtifactRegistrar for FlakyRegistrar {
    fn register(&self, _usage: &UsageRecord, paths: &[String]) -> Result<(), String> {
        assert!(!paths.is_empty());
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.fail_first {
            Err("artifact store unavailable".into())
        } else {
            Ok(())
        }
    }
}

#[test]
fn e_artifact_registration_retries_then_settles_unregistered() {
    let reg = Registry::open_for_tests().unwrap();
    let p = pricing();
    let settings = PassSettings::default();
    account(&reg, &p, "art", "payg", "5.000000");
    let arts = vec!["/workspace/out.csv".to_string(), "/workspace/plot.png".to_string()];
    let u = reg.record_usage("art", "t", "env_art", 90, &arts).unwrap();
    assert_eq!(u.artifacts_state, ArtifactsState::Pending);
    // Idempotent on (environment, path).
    reg.record_usage("art", "t", "env_art", 90, &arts).unwrap();
    assert_eq!(reg.usage_artifacts("env_art").unwrap(), arts);
    // Settling directly while artifacts are pending is refused.
    assert!(matches!(reg.settle_usage(&p, u.usage_id), Err(BillingError::ArtifactsPending)));

    let always = FlakyRegistrar { calls: AtomicU32::new(0), fail_first: u32::MAX };
    let cash_before = reg.account("art").unwrap().unwrap().cash_balance;
    for attempt in 1..=9 {
        let r = run_pending_pass(&reg, &p, &always, &settings).unwrap();
        assert_eq!((r.artifact_failures, r.settled), (1, 0), "attempt {attempt}");
        let rec = reg.usage(u.usage_id).unwrap().unwrap();
        assert_eq!(
            (rec.artifacts_state, rec.artifact_attempts, rec.is_settled()),
            (ArtifactsState::Pending, attempt, false)
        );
        assert_eq!(reg.account("art").unwrap().unwrap().cash_balance, cash_before);
    }
    let r = run_pending_pass(&reg, &p, &always, &settings).unwrap();
    assert_eq!((r.artifacts_given_up, r.settled), (1, 1));
    let rec = reg.usage(u.usage_id).unwrap().unwrap();
    assert_eq!(
        (rec.artifacts_state, rec.artifact_attempts, rec.is_settled()),
        (ArtifactsState::Unregistered, 10, true)
    );
    assert_eq!(always.calls.load(Ordering::SeqCst), 10);
    assert_eq!(reg.account("art").unwrap().unwrap().cash_balance, m("4.900000"));
    // An operator may still mark them registered afterwards (idempotent).
    assert_eq!(reg.mark_artifacts_registered(&[u.usage_id]).unwrap(), 1);
    assert_eq!(reg.mark_artifacts_registered(&[u.usage_id]).unwrap(), 0);

    // A registrar that recovers: registered, then settled in the same round.
    let u2 = reg.record_usage("art", "t", "env_art2", 30, &arts[..1]).unwrap();
    let flaky = FlakyRegistrar { calls: AtomicU32::new(0), fail_first: 3 };
    for _ in 0..3 {
        assert_eq!(run_pending_pass(&reg, &p, &flaky, &settings).unwrap().settled, 0);
    }
    let r = run_pending_pass(&reg, &p, &flaky, &settings).unwrap();
    assert_eq!((r.artifacts_registered, r.settled), (1, 1));
    let rec = reg.usage(u2.usage_id).unwrap().unwrap();
    assert_eq!((rec.artifacts_state, rec.artifact_attempts), (ArtifactsState::Registered, 3));
    assert_books_agree(&reg);
}

// ---------- the admin API and the loop inside a running daemon ----------

const ADMIN_TOKEN: &str = "admin-token-for-billing-tests";

fn write_config(dir: &Path, port: u16, pricing: &str) -> std::path::PathBuf {
    serve_process::write_config(dir, port, &format!("\n[store]\nkind = \"local\"\n\n{pricing}"))
}

/// Where a daemon test's registry is: its data directory's SQLite file, or a fresh schema of the
/// suites' PostgreSQL database (`[registry]` of [`start_daemon`]'s configuration then names it).
fn daemon_place(dir: &Path) -> String {
    let place = test_backend::new_place(dir);
    match place.starts_with("pg:") {
        true => place,
        false => dir.join("data/control/registry.sqlite3").to_string_lossy().into_owned(),
    }
}

/// A ready `scopefs serve` on the registry at `place` (killed on drop).
fn start_daemon(dir: &Path, place: &str, pricing: &str) -> ServeProcess {
    let port = serve_process::free_port();
    let registry = match place.strip_prefix("pg:") {
        Some(schema) => {
            let url = std::env::var(test_backend::POSTGRES_URL_ENV).unwrap();
            format!("\n[registry]\nurl = {url:?}\nschema = {schema:?}\n")
        }
        None => String::new(),
    };
    let config = write_config(dir, port, &format!("{pricing}{registry}"));
    let env = [("SCOPEFS_ADMIN_TOKEN", ADMIN_TOKEN), ("SCOPEFS_PRICING_SETTLE_INTERVAL_SECS", "1")];
    let mut d = ServeProcess::start(dir, &config, port, "daemon.log", &env);
    d.wait_ready(&reqwest::blocking::Client::new());
    d
}

#[test]
fn admin_api_accounts_usage_and_the_settlement_loop() {
    use serde_json::{json, Value};
    let dir = tempfile::tempdir().unwrap();
    // Usage recorded before the daemon starts (as an ended environment would leave it).
    let place = daemon_place(dir.path());
    {
        let reg = test_backend::open_place(&place).unwrap();
        reg.record_usage("alice", "thr_a", "env_http_1", 150, &[]).unwrap();
        reg.record_usage("alice", "thr_a", "env_http_2", 30, &["/workspace/r.txt".to_string()]).unwrap();
    }
    let pricing = "[pricing]\novertime_price_per_minute = \"0.100000\"\ndefault_plan = \"payg\"\n\
                   [pricing.plans.payg]\ncompute_allowed = true\nmonthly_minutes = 0\nhard_max_runtime_seconds = 3600\n\
                   [pricing.plans.pro]\ncompute_allowed = true\nmonthly_minutes = 1\nhard_max_runtime_seconds = 7200\n";
    let d = start_daemon(dir.path(), &place, pricing);
    let c = reqwest::blocking::Client::new();
    let url = |p: &str| format!("{}{p}", d.base);
    let admin = |rb: reqwest::blocking::RequestBuilder| rb.header("X-Admin-Token", ADMIN_TOKEN).send().unwrap();

    // Authentication: no token or a wrong one is 401 on every admin route.
    assert_eq!(c.post(url("/admin/pending-usage")).json(&json!({})).send().unwrap().status(), 401);
    let wrong = c.get(url("/admin/accounts/alice")).header("X-Admin-Token", "nope").send().unwrap();
    assert_eq!(wrong.status(), 401);
    let bearer = c.get(url("/admin/accounts/alice")).bearer_auth(ADMIN_TOKEN).send().unwrap();
    assert_eq!(bearer.status(), 401, "the admin token is only accepted in X-Admin-Token");

    // Nothing can be settled without cash: the loop leaves both pending (the second waits on nothing).
    let pending: Value = admin(c.post(url("/admin/pending-usage")).json(&json!({"limit": 10}))).json().unwrap();
    // Least recently attempted first: the daemon's own loop may already have tried one of them.
    let mut usage = pending["usage"].as_array().unwrap().clone();
    usage.sort_by_key(|u| u["environment_id"].as_str().unwrap().to_string());
    assert_eq!(usage.len(), 2);
    assert_eq!(usage[1]["environment_id"], "env_http_2");
    assert_eq!(usage[1]["artifacts"], json!(["/workspace/r.txt"]));
    let ids: Vec<i64> = usage.iter().map(|u| u["usage_id"].as_i64().unwrap()).collect();
    let res: Value =
        admin(c.post(url("/admin/mark-settled")).json(&json!({"usage_ids": [ids[0], 999_999]}))).json().unwrap();
    assert_eq!(res["results"][0]["status"], "insufficient_compute_balance");
    assert_eq!(res["results"][1]["status"], "not_found");

    // Money is a string: a JSON number or excess precision is refused.
    for bad in [json!({"amount": 10, "idempotency_key": "k1"}), json!({"amount": "1.0000001", "idempotency_key": "k1"})]
    {
        let r = admin(c.post(url("/admin/accounts/alice/credit")).json(&bad));
        assert_eq!(r.status(), 400, "{bad}");
    }
    let cr: Value = admin(
        c.post(url("/admin/accounts/alice/credit")).json(&json!({"amount": "1.000000", "idempotency_key": "k1"})),
    )
    .json()
    .unwrap();
    assert_eq!(cr["account"]["cash_balance"], "1.000000");
    let again = admin(
        c.post(url("/admin/accounts/alice/credit")).json(&json!({"amount": "1.000000", "idempotency_key": "k1"})),
    );
    assert_eq!(again.json::<Value>().unwrap()["account"]["cash_balance"], "1.000000");
    let conflict =
        admin(c.post(url("/admin/accounts/alice/credit")).json(&json!({"amount": "2", "idempotency_key": "k1"})));
    assert_eq!(conflict.status(), 409);

    // The loop (1 s) settles env 1 (3 min = 0.30); env 2 first registers its artifacts, then 1 min = 0.10.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p: Value = admin(c.post(url("/admin/pending-usage")).json(&json!({}))).json().unwrap();
        if p["usage"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "loop did not settle: {p}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let acc: Value = admin(c.get(url("/admin/accounts/alice"))).json().unwrap();
    assert_eq!((acc["cash_balance"].as_str(), acc["compute_minutes_used"].as_i64()), (Some("0.600000"), Some(4)));
    let res: Value = admin(c.post(url("/admin/mark-settled")).json(&json!({"usage_ids": ids}))).json().unwrap();
    assert_eq!(res["results"][0]["status"], "already_settled");
    assert_eq!(res["results"][1]["status"], "already_settled");
    let marked: Value =
        admin(c.post(url("/admin/mark-artifacts-registered")).json(&json!({"usage_ids": ids}))).json().unwrap();
    assert_eq!(marked["updated"], 0, "already registered: idempotent");
    let ledger: Value = admin(c.get(url("/admin/accounts/alice/ledger?limit=10"))).json().unwrap();
    let entries = ledger["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0]["idempotency_key"], "compute:alice:thr_a:env_http_2");
    assert_eq!(entries[0]["amount"], "0.100000");
    assert_eq!(entries[2]["direction"], "credit");

    // Plans.
    let acc: Value = admin(c.put(url("/admin/accounts/alice/plan")).json(&json!({"plan": "pro"}))).json().unwrap();
    assert_eq!((acc["plan"].as_str(), acc["compute_quota_monthly"].as_i64()), (Some("pro"), Some(1)));
    assert_eq!(admin(c.put(url("/admin/accounts/alice/plan")).json(&json!({"plan": "gold"}))).status(), 400);
    assert_eq!(admin(c.get(url("/admin/accounts/nobody"))).status(), 404);
    // Issue 24 item 8: the operator's quota adjustment, and the audit log of every change above.
    let adjust = |body: Value| admin(c.put(url("/admin/accounts/alice/quota-adjustment")).json(&body));
    let acc: Value = adjust(json!({"minutes": 9})).json().unwrap();
    assert_eq!((acc["compute_quota_adjustment"].as_i64(), acc["compute_quota_monthly"].as_i64()), (Some(9), Some(10)));
    for bad in [json!({"minutes": 2_000_000}), json!({"minutes": "9"}), json!({})] {
        assert_eq!(adjust(bad.clone()).status(), 400, "{bad}");
    }
    let log: Value = admin(c.get(url("/admin/audit-log?limit=500"))).json().unwrap();
    let mut seen: Vec<String> =
        log["entries"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap().to_string()).collect();
    seen.reverse();
    // The loop's settlements are not admin requests; the refused credit and plan left no row.
    assert_eq!(seen, ["credit", "set_plan", "set_quota_adjustment"], "{log}");
    assert_eq!(log["entries"][0]["detail"]["minutes"], 9);
    assert_eq!(admin(c.get(url("/admin/audit-log?limit=0"))).status(), 400);
    assert_eq!(c.get(url("/admin/audit-log")).send().unwrap().status(), 401);
    // Every admin route is in the OpenAPI document with the admin scheme.
    let doc: Value = c.get(url("/openapi.json")).send().unwrap().json().unwrap();
    assert_eq!(doc["paths"]["/admin/accounts/{user_id}/credit"]["post"]["x-scopefs-auth"], "admin_token");
}

#[test]
fn serve_refuses_a_price_not_above_zero_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for price in ["\"0\"", "\"-0.05\"", "0.05"] {
        let config = write_config(dir.path(), 1, &format!("[pricing]\novertime_price_per_minute = {price}\n"));
        let out = Command::new(BIN).arg("--config").arg(&config).arg("serve").stdin(Stdio::null()).output().unwrap();
        assert!(!out.status.success(), "{price}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("overtime_price_per_minute"), "{price}: {err}");
    }
}

// ---------- issue 12 b: outputs → artifacts → registration retries → one settlement ----------

/// Fails its first `fail_first` calls, then registers through the daemon's own registrar.
struct FailThenRegistry {
    calls: AtomicU32,
    fail_first: u32,
    inner: billing::RegistryRegistrar,
}

impl ArtifactRegistrar for FailThenRegistry {
    fn register(&self, usage: &UsageRecord, paths: &[String]) -> Result<(), String> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.fail_first {
            return Err("artifact store unavailable".into());
        }
        self.inner.register(usage, paths)
    }
}

/// An environment ends with an output manifest (recorded with its usage in the ending
/// transaction); the registrar fails twice, then succeeds; the usage is settled exactly once, after
/// its artifacts are registered; ledger, usage log and artifact registry agree.
#[test]
fn b_outputs_become_artifacts_registered_before_a_single_settlement() {
    use scopefs::ids::ThreadId;
    use scopefs::registry::billing::ArtifactEntry;
    use scopefs::registry::environments::NewEnvironment;
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let dep = reg.deployment("d");
    let p = pricing();
    account(&reg, &p, "art-e2e", "payg", "5.000000");
    let pr = dep.provision("op-e2e", &ThreadId::parse("thr-e2e").unwrap(), None).unwrap();
    let scope = dep.complete_provision(&pr.scope.scope_id).unwrap().scope_id;
    let new = NewEnvironment {
        user_id: "art-e2e".into(),
        thread_id: "thr-e2e".into(),
        read_only: false,
        requested_max_runtime_seconds: Some(600),
        effective_max_runtime_seconds: 600,
        max_live_per_scope: 4,
        pricing_snapshot: None,
    };
    let env = dep.create_environment(&scope, &new).unwrap().unwrap().environment_id;
    dep.environment_started(&env).unwrap().unwrap();
    let entry = |path: &str, byte: char| ArtifactEntry {
        path: path.into(),
        size_bytes: 3,
        sha256: byte.to_string().repeat(64),
        content_type: "text/csv".into(),
        // The snapshot that keeps an artifact's bytes (or none: recorded before they were kept).
        snapshot_id: (byte == 'a').then(|| format!("out.{path}")),
    };
    let manifest = vec![entry("out/a.csv", 'a'), entry("out/b.csv", 'b')];
    let (_, ended) = dep.end_environment_with_outputs(&env, false, "destroyed", &manifest).unwrap();
    assert!(ended);
    let usage = reg.usage_by_environment(&env).unwrap().expect("usage recorded with the end");
    assert_eq!(usage.artifacts_state, ArtifactsState::Pending);
    let rows = reg.artifact_manifest(&env).unwrap();
    assert_eq!(rows.iter().map(|r| r.entry.clone()).collect::<Vec<_>>(), manifest);
    assert!(rows.iter().all(|r| r.registered_at.is_none()));

    let registrar = FailThenRegistry {
        calls: AtomicU32::new(0),
        fail_first: 2,
        inner: billing::RegistryRegistrar::new(reg.clone()),
    };
    let settings = PassSettings::default();
    let cash = reg.account("art-e2e").unwrap().unwrap().cash_balance;
    for attempt in 1..=2 {
        let r = run_pending_pass(&reg, &p, &registrar, &settings).unwrap();
        assert_eq!((r.artifact_failures, r.settled), (1, 0), "attempt {attempt}");
        assert_eq!(reg.account("art-e2e").unwrap().unwrap().cash_balance, cash, "no money before artifacts");
        assert!(reg.artifact_manifest(&env).unwrap().iter().all(|r| r.registered_at.is_none()));
    }
    let r = run_pending_pass(&reg, &p, &registrar, &settings).unwrap();
    assert_eq!((r.artifacts_registered, r.settled), (1, 1));
    // Later rounds find nothing to do: settled exactly once.
    let r = run_pending_pass(&reg, &p, &registrar, &settings).unwrap();
    assert_eq!((r.listed, r.settled), (0, 0));
    assert_eq!(reg.settle_usage(&p, usage.usage_id).unwrap().status, SettleStatus::AlreadySettled);
    let rec = reg.usage(usage.usage_id).unwrap().unwrap();
    assert_eq!((rec.artifacts_state, rec.artifact_attempts, rec.is_settled()), (ArtifactsState::Registered, 2, true));
    let rows = reg.artifact_manifest(&env).unwrap();
    assert!(rows.iter().all(|r| r.registered_at.is_some_and(|t| t <= rec.settled_at.unwrap())), "{rows:?}");
    let compute_rows: Vec<_> = reg
        .ledger("art-e2e", 100, None)
        .unwrap()
        .into_iter()
        .filter(|e| e.entry_type == "compute_overtime" && e.source_id.contains(&env))
        .collect();
    assert_eq!(compute_rows.len(), 1, "one ledger row for the environment");
    assert_eq!(rec.ledger_entry_id, Some(compute_rows[0].entry_id));
    assert_eq!(registrar.calls.load(Ordering::SeqCst), 3);
    assert_books_agree(&reg);
}

/// Issue 24, item 5, through the daemon: with `[billing] mode = "report"` a gateway following seed
/// 003 §10.2 settles in its own wallet and calls `/admin/mark-settled`, which only marks: the record
/// is listed as settled, the daemon's ledger has no row and the account is not charged (at 2351eb5
/// the same call charged the daemon's wallet: a second charge). Artifacts are registered first.
#[test]
fn report_mode_mark_settled_only_marks() {
    use serde_json::{json, Value};
    let dir = tempfile::tempdir().unwrap();
    let place = daemon_place(dir.path());
    let (plain, with_outputs) = {
        let reg = test_backend::open_place(&place).unwrap();
        let plain = reg.record_usage("gw", "thr_g", "env_rep_1", 150, &[]).unwrap().usage_id;
        let outputs = reg.record_usage("gw", "thr_g", "env_rep_2", 30, &["/workspace/o.txt".into()]).unwrap();
        (plain, outputs.usage_id)
    };
    let config = "[billing]\nmode = \"report\"\n\n[pricing]\ndefault_plan = \"payg\"\n[pricing.plans.payg]\n\
                  compute_allowed = true\nmonthly_minutes = 0\nhard_max_runtime_seconds = 3600\n";
    let d = start_daemon(dir.path(), &place, config);
    let c = reqwest::blocking::Client::new();
    let admin = |path: &str, body: Value| -> Value {
        let r = c.post(format!("{}{path}", d.base)).header("X-Admin-Token", ADMIN_TOKEN).json(&body).send().unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().unwrap()
    };
    let status = |v: &Value, i: usize| v["results"][i]["status"].as_str().unwrap_or_default().to_string();
    let res = admin("/admin/mark-settled", json!({"usage_ids": [plain, with_outputs]}));
    assert_eq!((status(&res, 0), status(&res, 1)), ("settled".into(), "artifacts_pending".into()), "{res}");
    admin("/admin/mark-artifacts-registered", json!({"environment_id": "env_rep_2"}));
    let res = admin("/admin/mark-settled", json!({"usage_ids": [plain, with_outputs]}));
    assert_eq!((status(&res, 0), status(&res, 1)), ("already_settled".into(), "settled".into()), "{res}");
    let settled = admin("/admin/pending-usage", json!({"settled": 1, "limit": 10}));
    let listed: Vec<i64> = settled["usage"].as_array().unwrap().iter().filter_map(|u| u["usage_id"].as_i64()).collect();
    assert!(listed.contains(&plain) && listed.contains(&with_outputs), "{settled}");
    let reg = test_backend::open_place(&place).unwrap();
    for id in [plain, with_outputs] {
        let u = reg.usage(id).unwrap().unwrap();
        assert_eq!((u.settlement_status.as_str(), u.ledger_entry_id), ("reported", None));
    }
    assert_eq!(ledger_len(&reg, "gw"), 0, "the daemon charged nothing");
    assert!(reg.account("gw").unwrap().is_none_or(|a| a.compute_overtime_charged == Micros::ZERO));
    assert_books_agree(&reg);
}
