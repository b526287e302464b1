//! The admin page's HTML (maud: every value is escaped): the layout with its navigation and logout
//! form, the login form, and one template per page over the views `data` gathers. Presentation
//! only: sizes, ages and money are formatted here with integer arithmetic.

use std::time::SystemTime;

use maud::{html, Markup, DOCTYPE};
use scopefs::billing::Micros;
use scopefs::registry::billing::{Account, LedgerEntry};
use scopefs::registry::environments::EnvironmentRecord;

use super::data::{Check, EnvRow, FileRow, ScopeRow, ScopeView, ScopesView, UsageRow};

/// The navigation: (path, label).
const NAV: [(&str, &str); 6] = [
    ("/admin/ui", "Scopes"),
    ("/admin/ui/environments", "Environments"),
    ("/admin/ui/accounts", "Accounts"),
    ("/admin/ui/usage", "Pending usage"),
    ("/admin/ui/refusals", "Refusals"),
    ("/admin/ui/health", "Health"),
];

/// A page: `csrf` is the session's token (the logout form); `None` on the login page.
pub fn layout(title: &str, csrf: Option<&str>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "scopefs admin · " (title) }
                link rel="stylesheet" href="/admin/ui/style.css";
            }
            body {
                header {
                    span.brand { "scopefs admin" }
                    @if let Some(csrf) = csrf {
                        nav {
                            @for (href, label) in &NAV { a href=(href) { (label) } }
                        }
                        form #logout method="post" action="/admin/ui/logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// The login form; `error` says why the last attempt failed.
pub fn login(error: Option<&str>) -> Markup {
    let body = html! {
        @if let Some(e) = error { p.error #login-error { (e) } }
        form #login method="post" action="/admin/ui/login" {
            label for="token" { "Admin token" }
            input #token type="password" name="token" autocomplete="current-password" required autofocus;
            button type="submit" { "Log in" }
        }
        p.hint {
            "The admin token is in the daemon's configuration (admin_token) or shown by "
            code { "scopefs token show admin" } "."
        }
    };
    layout("Log in", None, body)
}

/// An error answer as a page.
pub fn error(csrf: Option<&str>, code: &str, message: &str) -> Markup {
    layout("Error", csrf, html! { p.error #error { code { (code) } ": " (message) } })
}

/// Bytes with a binary unit, one decimal (integer arithmetic).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scaled = u128::from(n) * 10;
    while scaled >= 10 * 1024 && unit + 1 < UNITS.len() {
        scaled /= 1024;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{}.{} {}", scaled / 10, scaled % 10, UNITS[unit])
    }
}

/// A duration in seconds, e.g. `2 h 5 min`, `42 s`.
pub fn duration(secs: u64) -> String {
    match secs {
        0..=59 => format!("{secs} s"),
        60..=3599 => format!("{} min {} s", secs / 60, secs % 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

/// How long before `now_ms` a Unix-ms time was.
fn ago(now_ms: i64, at_ms: i64) -> String {
    format!("{} ago", duration(u64::try_from(now_ms.saturating_sub(at_ms) / 1000).unwrap_or(0)))
}

fn ago_system(t: Option<SystemTime>) -> String {
    t.and_then(|t| SystemTime::now().duration_since(t).ok())
        .map_or_else(|| "-".into(), |d| format!("{} ago", duration(d.as_secs())))
}

/// A table's header row.
fn head(names: &[&str]) -> Markup {
    html! { thead { tr { @for n in names { th { (n) } } } } }
}

fn usage_cell(row: &ScopeRow) -> Markup {
    html! {
        @match &row.usage {
            Some(u) => {
                (bytes(u.bytes)) " of " (bytes(row.quota.bytes)) " · "
                (u.inodes) " of " (row.quota.inodes) " inodes"
            }
            None => { "closed · quota " (bytes(row.quota.bytes)) }
        }
    }
}

fn scope_table(rows: &[ScopeRow]) -> Markup {
    html! {
        table {
            (head(&["scope", "thread", "user", "usage / quota", "node"]))
            tbody {
                @for r in rows {
                    tr data-scope=(r.scope_id) data-state=(r.state) {
                        td { a href={ "/admin/ui/scopes/" (r.scope_id) } { code { (r.scope_id) } } }
                        td { code { (r.thread_id) } }
                        td { (r.user_id.as_deref().unwrap_or("-")) }
                        td { (usage_cell(r)) }
                        td { (r.node) }
                    }
                }
            }
        }
    }
}

/// Scopes by state.
pub fn scopes(csrf: &str, view: &ScopesView) -> Markup {
    let shown: usize = view.groups.iter().map(|(_, rows)| rows.len()).sum();
    let body = html! {
        p { (view.total) " scopes" @if shown < view.total { " (the " (shown) " most recently changed shown)" } }
        @for (state, rows) in &view.groups {
            section #{ "state-" (state) } {
                h2 { (state) " " span.count { "(" (rows.len()) ")" } }
                @if rows.is_empty() { p.empty { "none" } } @else { (scope_table(rows)) }
            }
        }
    };
    layout("Scopes", Some(csrf), body)
}

fn file_rows(view: &ScopeView, files: &[FileRow]) -> Markup {
    html! {
        table #files {
            (head(&["name", "kind", "size", "modified"]))
            tbody {
                @for f in files {
                    tr data-path=(f.path) {
                        td {
                            @if f.kind == "directory" {
                                a href={ "/admin/ui/scopes/" (view.scope.scope_id) "?path=" (f.path) } { (f.name) "/" }
                            } @else { (f.name) }
                        }
                        td { (f.kind) }
                        td { @if f.kind == "directory" { "-" } @else { (bytes(f.size)) } }
                        td { (ago_system(f.modified)) }
                    }
                }
            }
        }
        @if view.more_files > 0 { p { "and " (view.more_files) " more" } }
    }
}

fn environment_table(now_ms: i64, envs: &[EnvironmentRecord]) -> Markup {
    html! {
        table #scope-environments {
            (head(&["environment", "state", "created", "runtime", "end reason"]))
            tbody {
                @for e in envs {
                    tr data-env=(e.environment_id) data-state=(e.state) {
                        td { code { (e.environment_id) } } td { (e.state) } td { (ago(now_ms, e.created_at)) }
                        td { (e.runtime_seconds.map_or_else(|| "-".into(), duration)) }
                        td { (e.end_reason.as_deref().unwrap_or("-")) }
                    }
                }
            }
        }
    }
}

/// One scope: its files (one directory) and its environments.
pub fn scope(csrf: &str, now_ms: i64, view: &ScopeView) -> Markup {
    let s = &view.scope;
    let body = html! {
        p {
            "state " strong { (s.state) } " · thread " code { (s.thread_id) }
            " · user " (s.user_id.as_deref().unwrap_or("-")) " · node " (s.node) " · " (usage_cell(s))
        }
        h2 { "Files in " code #dir { (view.dir) } }
        @match &view.files {
            Ok(files) if files.is_empty() => { p.empty { "empty directory" } }
            Ok(files) => { (file_rows(view, files)) }
            Err(e) => { p.error { code { (e.code) } ": " (e.message) } }
        }
        h2 { "Environments" }
        @if view.environments.is_empty() { p.empty { "none" } }
        @else { (environment_table(now_ms, &view.environments)) }
    };
    layout(&format!("Scope {}", s.scope_id), Some(csrf), body)
}

fn cost_cell(row: &EnvRow) -> Markup {
    html! {
        @match &row.cost {
            Ok((currency, c)) => {
                (c.compute_minutes) " min (" (c.free_minutes) " free) · " (c.overtime_amount) " " (currency)
            }
            Err(e) => { span.error { (e) } }
        }
    }
}

fn process_list(row: &EnvRow) -> Markup {
    html! {
        @if row.processes.is_empty() { span.empty { "no processes" } } @else {
            ul.processes {
                @for p in &row.processes {
                    li data-process=(p.process_id) { code { (p.process_id) } " " (p.state) " · " code { (short(&p.command)) } }
                }
            }
        }
    }
}

/// Live environments with their processes, runtime and cost so far.
pub fn environments(csrf: &str, now_ms: i64, total: usize, rows: &[EnvRow]) -> Markup {
    let body = html! {
        p { (total) " live environments" }
        @if rows.is_empty() { p.empty #no-environments { "none" } } @else {
            table #environments {
                (head(&["environment", "scope · user", "state", "runtime", "cost so far", "processes"]))
                tbody {
                    @for r in rows {
                        tr data-env=(r.env.environment_id) data-state=(r.env.state) {
                            td { code { (r.env.environment_id) } }
                            td {
                                a href={ "/admin/ui/scopes/" (r.env.scope_id) } { code { (r.env.scope_id) } }
                                " · " (r.env.user_id)
                            }
                            td { (r.env.state) }
                            td { (ago(now_ms, r.env.started_at.unwrap_or(r.env.created_at)).trim_end_matches(" ago")) }
                            td { (cost_cell(r)) }
                            td { (process_list(r)) }
                        }
                    }
                }
            }
        }
    };
    layout("Environments", Some(csrf), body)
}

/// A command as the page shows it: its first 120 characters.
fn short(text: &str) -> String {
    const MAX_CHARS: usize = 120;
    match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn money(m: Micros) -> String {
    m.to_string()
}

/// Every account with its balance.
pub fn accounts(csrf: &str, accounts: &[Account]) -> Markup {
    let body = html! {
        @if accounts.is_empty() { p.empty { "no accounts" } } @else {
            table #accounts {
                (head(&["user", "plan", "minutes left / month", "cash balance", "overtime charged"]))
                tbody {
                    @for a in accounts {
                        tr data-user=(a.user_id) {
                            td { a href={ "/admin/ui/accounts/" (a.user_id) } { (a.user_id) } }
                            td { (a.plan) }
                            td { (a.compute_minutes_remaining) " / " (a.compute_quota_monthly) }
                            td.money { (money(a.cash_balance)) }
                            td.money { (money(a.compute_overtime_charged)) }
                        }
                    }
                }
            }
        }
    };
    layout("Accounts", Some(csrf), body)
}

/// One account and its ledger.
pub fn account(csrf: &str, now_ms: i64, a: &Account, ledger: &[LedgerEntry]) -> Markup {
    let body = html! {
        p {
            "plan " strong { (a.plan) }
            " · minutes left " (a.compute_minutes_remaining) " of " (a.compute_quota_monthly)
            " · cash balance " strong #balance { (money(a.cash_balance)) } " · credited " (money(a.total_credited))
        }
        h2 { "Ledger" }
        @if ledger.is_empty() { p.empty { "no entries" } } @else {
            table #ledger {
                (head(&["entry", "type", "source", "amount", "balance after", "minutes (free)", "when"]))
                tbody {
                    @for e in ledger {
                        tr data-entry=(e.entry_id) data-source=(e.source_id) data-type=(e.entry_type) {
                            td { (e.entry_id) } td { (e.entry_type) } td { (e.source_type) " " code { (e.source_id) } }
                            td.money { @if e.direction == "debit" { "-" } (money(e.amount)) " " (e.currency) }
                            td.money { (money(e.balance_after)) }
                            td { (e.compute_minutes.map_or_else(|| "-".into(), |m| m.to_string()))
                                 " (" (e.free_minutes.map_or_else(|| "-".into(), |m| m.to_string())) ")" }
                            td { (ago(now_ms, e.created_at)) }
                        }
                    }
                }
            }
        }
    };
    layout(&format!("Account {}", a.user_id), Some(csrf), body)
}

fn usage_table(id: &str, rows: &[UsageRow]) -> Markup {
    html! {
        @if rows.is_empty() { p.empty { "none" } } @else {
            table id=(id) {
                (head(&["usage", "environment", "user", "runtime", "artifacts", "settlement"]))
                tbody {
                    @for r in rows {
                        tr data-usage=(r.usage.usage_id) data-env=(r.usage.environment_id) {
                            td { (r.usage.usage_id) } td { code { (r.usage.environment_id) } }
                            td { a href={ "/admin/ui/accounts/" (r.usage.user_id) } { (r.usage.user_id) } }
                            td {
                                (duration(u64::try_from(r.usage.runtime_seconds).unwrap_or(0)))
                                " (" (r.usage.compute_minutes) " min)"
                            }
                            td { (format!("{:?}", r.usage.artifacts_state).to_lowercase())
                                 @for p in &r.artifacts { br; code { (p) } } }
                            td { (r.usage.settlement_status)
                                 @if let Some(c) = r.usage.overtime_charged { " · charged " (money(c)) }
                                 @if let Some(e) = &r.usage.settlement_error { br; span.error { (e) } } }
                        }
                    }
                }
            }
        }
    }
}

/// Pending and settled usage with artifacts.
pub fn usage(csrf: &str, pending: &[UsageRow], settled: &[UsageRow]) -> Markup {
    let body = html! {
        h2 { "Pending" } (usage_table("pending", pending))
        h2 { "Settled" } (usage_table("settled", settled))
    };
    layout("Pending usage", Some(csrf), body)
}

/// Refusals by bound and by kind.
pub fn refusals(csrf: &str, bounds: &[(&str, u64)], kinds: &[(&str, &str, u64)]) -> Markup {
    let body = html! {
        h2 { "By [limits] bound" }
        table #bounds {
            (head(&["bound", "refused"]))
            tbody { @for (b, n) in bounds { tr data-bound=(b) .nonzero[*n > 0] { td { code { (b) } } td { (n) } } } }
        }
        h2 { "Paths, symlinks and other scopes' ids" }
        table #kinds {
            (head(&["kind", "via", "refused"]))
            tbody {
                @for (k, via, n) in kinds {
                    tr data-kind=(k) data-via=(via) data-count=(n) .nonzero[*n > 0] {
                        td { (k) } td { (via) } td { (n) }
                    }
                }
            }
        }
    };
    layout("Refusals", Some(csrf), body)
}

/// The health of the store, the registry and Docker.
pub fn health(csrf: &str, checks: &[Check]) -> Markup {
    let body = html! {
        table #health {
            (head(&["check", "result", "detail"]))
            tbody {
                @for c in checks {
                    tr data-check=(c.name) .fail[!c.ok] {
                        td { (c.name) } td { @if c.ok { "PASS" } @else { "FAIL" } } td { (c.detail) }
                    }
                }
            }
        }
    };
    layout("Health", Some(csrf), body)
}

/// The page's stylesheet (served from `/admin/ui/style.css`: the CSP allows no inline style).
pub const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}\
header{display:flex;gap:1.5em;align-items:center;padding:.6em 1.2em;background:#243b53;color:#fff}\
header a{color:#d9e2ec;text-decoration:none;margin-right:1em}header a:hover{color:#fff}\
.brand{font-weight:600}#logout{margin-left:auto}main{padding:1em 1.5em}\
table{border-collapse:collapse;margin:.5em 0 1.5em;background:#fff}\
th,td{border:1px solid #d9e2ec;padding:.3em .6em;text-align:left;vertical-align:top}\
th{background:#f0f4f8}.money{text-align:right;font-variant-numeric:tabular-nums}\
.error,.fail td{color:#b42318}.empty{color:#829ab1}.count{color:#829ab1;font-weight:normal}\
.nonzero td{font-weight:600}code{font-size:12px}ul.processes{margin:0;padding-left:1em}\
form#login{display:flex;flex-direction:column;gap:.5em;max-width:22em}\
input,button{font:inherit;padding:.3em .6em}.hint{color:#627d98}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_durations_and_commands_are_formatted_without_floats() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(10 * 1024 * 1024 * 1024), "10.0 GiB");
        assert_eq!(duration(42), "42 s");
        assert_eq!(duration(125), "2 min 5 s");
        assert_eq!(duration(7500), "2 h 5 min");
        assert_eq!(short("sleep 300"), "sleep 300");
        assert_eq!(short(&"é".repeat(200)).chars().count(), 121);
    }

    #[test]
    fn values_are_escaped() {
        let page = error(Some("c\"srf"), "code", "<script>alert(1)</script>").into_string();
        assert!(!page.contains("<script>") && page.contains("&lt;script&gt;"), "{page}");
        assert!(page.contains("value=\"c&quot;srf\""), "{page}");
    }
}
