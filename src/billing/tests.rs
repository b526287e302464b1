//! Unit tests of the billing arithmetic: preflight (seed 003 §10.1), compute minutes, the charge split, periods.

use super::*;

fn acct(plan: &str, minutes: i64, cash: &str) -> AccountBalance {
    AccountBalance { plan: plan.into(), compute_minutes_remaining: minutes, cash_balance: Micros::parse(cash).unwrap() }
}

fn price() -> Micros {
    Micros::parse("0.050000").unwrap()
}

const PRO: PlanConfig = PlanConfig { compute_allowed: true, monthly_minutes: 120, hard_max_runtime_seconds: 7200 };

#[test]
fn seed_example_budget_snapshot() {
    // seed 003 §5: 120 minutes + 10.000000 at 0.050000/min → (120 + 200) * 60 = 19200 s.
    let p = preflight(&acct("pro", 120, "10.000000"), &PRO, price(), Some(60));
    assert!(p.quota_ok);
    assert_eq!(p.affordable_runtime_seconds, 19_200);
    assert_eq!(p.effective_max_runtime_seconds, 60);
    assert!(p.admitted());
}

#[test]
fn compute_minutes_round_up_with_a_minimum_of_one() {
    let cases = [(0, 1), (1, 1), (59, 1), (60, 1), (61, 2), (119, 2), (120, 2), (121, 3), (3600, 60)];
    for (secs, minutes) in cases {
        assert_eq!(compute_minutes(secs), minutes, "{secs}s");
    }
}

#[test]
fn split_uses_free_minutes_first() {
    let p = price();
    assert_eq!(
        split_charge(5, 10, p).unwrap(),
        Charge { compute_minutes: 5, free_minutes: 5, overtime_minutes: 0, overtime_amount: Micros::ZERO }
    );
    assert_eq!(split_charge(5, 0, p).unwrap().overtime_amount, Micros::from_micros(250_000));
    let mixed = split_charge(5, 2, p).unwrap();
    assert_eq!(
        (mixed.free_minutes, mixed.overtime_minutes, mixed.overtime_amount),
        (2, 3, Micros::from_micros(150_000))
    );
    // Negative remaining minutes grant nothing.
    assert_eq!(split_charge(3, -4, p).unwrap().free_minutes, 0);
    assert!(matches!(split_charge(i64::MAX, 0, p), Err(BillingError::Overflow)));
}

#[test]
fn month_periods_are_utc_calendar_months() {
    // 2026-05-23T12:00:00Z
    let ms = 1_779_537_600_000;
    let (start, end) = month_period(ms);
    assert_eq!(start, 1_777_593_600_000); // 2026-05-01
    assert_eq!(end, 1_780_272_000_000); // 2026-06-01
                                        // The last millisecond of December 2026 belongs to December; the next one starts 2027.
    assert_eq!(month_period(1_798_761_600_000 - 1), (1_796_083_200_000, 1_798_761_600_000));
    assert_eq!(month_period(1_798_761_600_000).0, 1_798_761_600_000);
    assert_eq!(month_period(end), (end, month_period(end).1));
    assert_eq!(month_period(0), (0, 31 * 86_400_000));
}

#[test]
fn pricing_defaults_validate_and_unknown_plans_allow_nothing() {
    let p = PricingConfig::default();
    p.validate().unwrap();
    let pre = p.preflight(&acct("no_such_plan", 100, "100"), Some(600));
    assert!(!pre.quota_ok);
    let bad = PricingConfig { overtime_price_per_minute: Micros::ZERO, ..PricingConfig::default() };
    assert_eq!(bad.validate().unwrap_err().key, "pricing.overtime_price_per_minute");
}

/// Issue 12 item 8: the default plan is a visible decision — the startup notice and every 429
/// name the plan and the `[pricing]` key behind the refusal.
#[test]
fn the_default_plan_and_its_refusals_name_the_plan_and_the_key() {
    let p = PricingConfig::default();
    assert!(!p.default_plan_allows_compute());
    let notice = p.default_plan_notice();
    assert!(
        notice.contains("\"starter\"") && notice.contains("pricing.default_plan") && notice.contains("NOT"),
        "{notice}"
    );
    let refused = p.preflight(&acct("starter", 0, "100.000000"), Some(600)).into_effective(&p).unwrap_err().to_string();
    assert!(refused.contains("\"starter\"") && refused.contains("pricing.plans.starter.compute_allowed"), "{refused}");
    let broke = p.preflight(&acct("pro", 0, "0.000000"), Some(600)).into_effective(&p).unwrap_err().to_string();
    assert!(broke.contains("\"pro\"") && broke.contains("pricing.overtime_price_per_minute"), "{broke}");
    let open = PricingConfig { default_plan: "pro".into(), ..PricingConfig::default() };
    assert!(open.default_plan_allows_compute() && !open.default_plan_notice().contains("NOT"));
}
