//! Issue 24 item 8 on either backend: a usage is charged at the price its environment was admitted
//! at, the operator's quota adjustment, and the admin audit log written with each change.

use std::sync::Arc;

use super::admin_audit::{self, AdminAction};
use super::billing::SettleStatus;
use super::environments::NewEnvironment;
use super::Registry;
use crate::billing::{BillingError, Micros, PlanConfig, PricingConfig};
use crate::ids::ThreadId;

fn m(s: &str) -> Micros {
    Micros::parse(s).unwrap()
}

/// The default pricing plus `payg` (compute, no free minutes), at `price` per overtime minute.
fn pricing(price: &str, currency: &str) -> PricingConfig {
    let mut p = PricingConfig::default();
    p.plans.insert(
        "payg".into(),
        PlanConfig { compute_allowed: true, monthly_minutes: 0, hard_max_runtime_seconds: 7200 },
    );
    p.overtime_price_per_minute = m(price);
    p.currency = currency.into();
    p.validate().unwrap();
    p
}

/// Admits (for up to `secs`), creates, starts and ends an environment of `user` under `p`; its
/// usage id (the end records it: a runtime under a minute, charged as one).
fn run_environment(reg: &Arc<Registry>, p: &PricingConfig, user: &str, thread: &str, secs: u64) -> i64 {
    let dep = reg.deployment("d");
    let pr = dep.provision(&format!("op-{thread}"), &ThreadId::parse(thread).unwrap(), None).unwrap();
    let scope = dep.complete_provision(&pr.scope.scope_id).unwrap().scope_id;
    let (effective, snapshot) = reg.admit_environment_priced(p, user, Some(secs)).unwrap();
    let new = NewEnvironment {
        user_id: user.into(),
        thread_id: thread.into(),
        read_only: false,
        requested_max_runtime_seconds: Some(secs),
        effective_max_runtime_seconds: effective,
        max_live_per_scope: 4,
        pricing_snapshot: Some(snapshot),
    };
    let env = dep.create_environment(&scope, &new).unwrap().unwrap().environment_id;
    dep.environment_started(&env).unwrap().unwrap();
    dep.end_environment(&env, false, "destroyed").unwrap();
    reg.usage_by_environment(&env).unwrap().unwrap().usage_id
}

/// Seed 003 §9.2: the price changes (a restart with new `[pricing]`) between an environment's end
/// and its settlement; it is charged at the price it was admitted at, in that currency, and the
/// usage and ledger rows keep that snapshot. A usage without one (older versions) pays the current
/// price; a snapshot that does not read back is refused, not guessed.
#[test]
fn a_usage_is_charged_at_the_price_its_environment_was_admitted_at() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let (old, new) = (pricing("0.050000", "CNY"), pricing("0.200000", "USD"));
    reg.set_plan(&old, "u-price", "payg").unwrap();
    reg.credit_cash(&old, "u-price", m("10.000000"), "seed", None).unwrap();
    let usage = run_environment(&reg, &old, "u-price", "thr-price", 180);
    let recorded = reg.usage(usage).unwrap().unwrap();
    assert_eq!(recorded.pricing_snapshot.as_deref(), Some(old.snapshot_json("payg").as_str()), "copied at the end");
    assert_eq!(recorded.compute_minutes, 1);

    let settled = reg.settle_usage(&new, usage).unwrap();
    assert_eq!(settled.status, SettleStatus::Settled);
    assert_eq!(settled.usage.overtime_charged, Some(m("0.050000")), "1 minute at the admitted 0.05, not 0.20");
    assert_eq!(settled.usage.pricing_snapshot, recorded.pricing_snapshot, "the snapshot is kept");
    let entry = &reg.ledger("u-price", 1, None).unwrap()[0];
    assert_eq!((entry.amount, entry.currency.as_str()), (m("0.050000"), "CNY"));
    assert_eq!(entry.pricing_snapshot, recorded.pricing_snapshot);
    assert_eq!(reg.account("u-price").unwrap().unwrap().cash_balance, m("9.950000"));

    // Recorded without an environment (an older version's usage): the current price.
    let legacy = reg.record_usage("u-price", "thr-price", "env-legacy", 60, &[]).unwrap();
    assert_eq!(legacy.pricing_snapshot, None);
    assert_eq!(reg.settle_usage(&new, legacy.usage_id).unwrap().usage.overtime_charged, Some(m("0.200000")));
    assert!(reg.billing_audit().unwrap().problems.is_empty());

    // A snapshot that does not read back.
    assert!(matches!(new.price_of(Some("{}")), Err(BillingError::Invalid { field: "pricing_snapshot", .. })));
    assert!(matches!(new.price_of(Some("not json")), Err(BillingError::Invalid { .. })));
    assert_eq!(new.price_of(None).unwrap(), ("USD".to_string(), m("0.200000")));
}

/// Seed 003 §9.1 `compute_quota_adjustment`: minutes added to (or taken from) the plan's monthly
/// quota, kept across plan changes and period refreshes, bounded.
#[test]
fn the_quota_adjustment_moves_the_monthly_quota_and_survives_plan_changes() {
    let reg = Registry::open_for_tests().unwrap();
    let p = pricing("0.050000", "CNY");
    let pro = p.plan("pro").unwrap().monthly_minutes;
    reg.set_plan(&p, "u-adj", "pro").unwrap();
    let acc = reg.set_quota_adjustment(&p, "u-adj", 30).unwrap();
    assert_eq!((acc.compute_quota_adjustment, acc.compute_quota_monthly), (30, pro + 30));
    assert_eq!(acc.compute_minutes_remaining, pro + 30);
    let acc = reg.set_quota_adjustment(&p, "u-adj", -(pro + 50)).unwrap();
    assert_eq!((acc.compute_quota_monthly, acc.compute_minutes_remaining), (0, 0), "never below 0");
    reg.set_quota_adjustment(&p, "u-adj", 10).unwrap();
    let acc = reg.set_plan(&p, "u-adj", "payg").unwrap();
    assert_eq!((acc.compute_quota_adjustment, acc.compute_quota_monthly), (10, 10), "kept across a plan change");
    // i64::MIN too: it has no absolute value (the check once panicked on it, and in release let it through).
    for bad in [admin_limit() + 1, -admin_limit() - 1, i64::MIN, i64::MAX] {
        assert!(matches!(
            reg.set_quota_adjustment(&p, "u-adj", bad),
            Err(BillingError::Invalid { field: "minutes", .. })
        ));
    }
    assert_eq!(reg.account("u-adj").unwrap().unwrap().compute_quota_adjustment, 10, "a refused one changes nothing");
}

fn admin_limit() -> i64 {
    super::billing::MAX_QUOTA_ADJUSTMENT
}

/// Every admin change is audited in its transaction: credits (not their idempotent replays), plan
/// and adjustment changes, settlement and artifact marks that change a record; a refused or failed
/// one (insufficient cash, already settled, nothing to mark) leaves no row.
#[test]
fn admin_changes_are_audited_with_the_change_and_refusals_are_not() {
    let reg = Registry::open_for_tests().unwrap();
    let p = pricing("0.050000", "CNY");
    let actions = |reg: &Registry| -> Vec<(String, String)> {
        let rows = reg.admin_audit(100, None).unwrap();
        rows.into_iter().rev().map(|e| (e.action, e.subject)).collect()
    };
    reg.set_plan(&p, "u-aud", "payg").unwrap();
    reg.credit_cash(&p, "u-aud", m("0.050000"), "k1", None).unwrap();
    reg.credit_cash(&p, "u-aud", m("0.050000"), "k1", None).unwrap();
    reg.set_quota_adjustment(&p, "u-aud", 5).unwrap();
    assert!(reg.set_plan(&p, "u-aud", "no-such-plan").is_err());
    let usage = reg.record_usage("u-aud", "t", "env-aud", 600, &["out/a.txt".into()]).unwrap().usage_id;
    let mark = |what: &'static str| AdminAction {
        action: what,
        subject: format!("usage:{usage}"),
        detail: serde_json::json!({ "usage_id": usage }),
    };
    assert_eq!(
        reg.mark_artifacts_registered_audited(&[usage], Some(&mark(admin_audit::MARK_ARTIFACTS_REGISTERED))).unwrap(),
        1
    );
    assert_eq!(
        reg.mark_artifacts_registered_audited(&[usage], Some(&mark(admin_audit::MARK_ARTIFACTS_REGISTERED))).unwrap(),
        0
    );
    // 10 minutes, 5 free: 0.25 owed, 0.05 held.
    let settle = mark(admin_audit::MARK_SETTLED);
    assert!(matches!(
        reg.settle_usage_audited(&p, usage, Some(&settle)),
        Err(BillingError::InsufficientComputeBalance { .. })
    ));
    reg.credit_cash(&p, "u-aud", m("1.000000"), "k2", None).unwrap();
    assert_eq!(reg.settle_usage_audited(&p, usage, Some(&settle)).unwrap().status, SettleStatus::Settled);
    assert_eq!(reg.settle_usage_audited(&p, usage, Some(&settle)).unwrap().status, SettleStatus::AlreadySettled);
    let u = format!("usage:{usage}");
    let expected: Vec<(String, String)> = [
        ("set_plan", "u-aud"),
        ("credit", "u-aud"),
        ("set_quota_adjustment", "u-aud"),
        ("mark_artifacts_registered", u.as_str()),
        ("credit", "u-aud"),
        ("mark_settled", u.as_str()),
    ]
    .into_iter()
    .map(|(a, s)| (a.to_string(), s.to_string()))
    .collect();
    assert_eq!(actions(&reg), expected);
    let rows = reg.admin_audit(2, None).unwrap();
    assert_eq!(rows.len(), 2, "bounded by limit");
    assert_eq!(rows[0].detail["usage_id"], usage);
    let older = reg.admin_audit(100, Some(rows[1].audit_id)).unwrap();
    assert_eq!(older.len(), 4, "paged by before");
    assert_eq!((older[2].action.as_str(), &older[2].detail["amount"]), ("credit", &serde_json::json!("0.050000")));
}

/// Issue 25 item 5 (the admin page): accounts listed most recently changed first, bounded; the
/// price an environment was admitted at read back by its id.
#[test]
fn accounts_are_listed_newest_first_and_an_environment_keeps_its_price() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let p = pricing("0.050000", "CNY");
    for user in ["u-list-a", "u-list-b", "u-list-c"] {
        reg.set_plan(&p, user, "payg").unwrap();
    }
    reg.credit_cash(&p, "u-list-a", m("1.000000"), "k-list", None).unwrap();
    let all = reg.accounts(10).unwrap();
    let mut users: Vec<&str> = all.iter().map(|a| a.user_id.as_str()).collect();
    assert!(all.windows(2).all(|w| w[0].updated_at >= w[1].updated_at), "most recently changed first");
    users.sort_unstable();
    assert_eq!(users, ["u-list-a", "u-list-b", "u-list-c"]);
    assert_eq!(reg.accounts(2).unwrap().len(), 2, "bounded by the limit");

    reg.credit_cash(&p, "u-list-b", m("1.000000"), "k-list-b", None).unwrap();
    let usage = run_environment(&reg, &p, "u-list-b", "t-list-env", 120);
    let env = reg.usage(usage).unwrap().unwrap().environment_id;
    let snapshot = reg.environment_pricing_snapshot(&env).unwrap().expect("recorded at admission");
    assert_eq!(p.price_of(Some(&snapshot)).unwrap(), ("CNY".to_string(), m("0.050000")));
    assert_eq!(reg.environment_pricing_snapshot("env_missing").unwrap(), None);
}
