//! `scopefs bench compare`: one table of every target's seconds per workload, with the ratios
//! the goals are stated in, from the `--json` reports of separate `scopefs bench` runs.
//!
//! All ratios are time ratios (seconds of the first target / seconds of the second), so for
//! every row, throughput rows included, a value below 1.0 means the first target is faster.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use serde::Deserialize;

/// Arguments of `scopefs bench compare`.
#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// Directory holding `<target>.json` reports (`scopefs bench DIR --json --label TARGET`);
    /// targets: native, bindfs, scopefs-local, scopefs-garage, s3fs, rclone (missing ones print `–`).
    pub results: PathBuf,
}

/// Known targets in column order: (file stem, column title).
pub const TARGETS: [(&str, &str); 6] = [
    ("native", "native"),
    ("bindfs", "bindfs"),
    ("scopefs-local", "scope, local"),
    ("scopefs-garage", "scope, Garage"),
    ("s3fs", "s3fs"),
    ("rclone", "rclone"),
];

/// Table rows in order.
pub const LINES: [&str; 10] = ["W1", "W2 cold", "W2 warm", "W3", "W4", "W5", "W6", "W7", "W8 p50", "W8 p99"];

/// Ratio columns: (title, numerator target, denominator target).
const RATIOS: [(&str, &str, &str); 4] = [
    ("scope/bindfs local", "scopefs-local", "bindfs"),
    ("scope/bindfs Garage", "scopefs-garage", "bindfs"),
    ("s3fs/scope Garage", "s3fs", "scopefs-garage"),
    ("rclone/scope Garage", "rclone", "scopefs-garage"),
];

/// The parts of a `scopefs bench --json` report the comparison reads.
#[derive(Debug, Deserialize)]
pub struct TargetReport {
    pub size_mib: u64,
    pub files: u64,
    pub rows: Vec<ReportRow>,
    #[serde(default)]
    pub daemon_peak_rss_kib: Option<u64>,
}

/// One measured step of a report.
#[derive(Debug, Deserialize)]
pub struct ReportRow {
    pub workload: String,
    pub name: String,
    pub seconds: f64,
}

/// The table row a report row adds its seconds to (W5's unpack and git steps add up).
fn line_of(row: &ReportRow) -> Option<&'static str> {
    Some(match row.workload.as_str() {
        "W1" => "W1",
        "W2" if row.name.contains("warm") => "W2 warm",
        "W2" => "W2 cold",
        "W3" => "W3",
        "W4" => "W4",
        "W5" => "W5",
        "W6" => "W6",
        "W7" => "W7",
        "W8" if row.name.ends_with("p99") => "W8 p99",
        "W8" => "W8 p50",
        _ => return None,
    })
}

/// Seconds per table row of one report.
fn seconds_by_line(report: &TargetReport) -> BTreeMap<&'static str, f64> {
    let mut out = BTreeMap::new();
    for row in &report.rows {
        if let Some(line) = line_of(row) {
            *out.entry(line).or_insert(0.0) += row.seconds;
        }
    }
    out
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.2}"))
}

/// The comparison as Markdown: the seconds table with ratio columns, then the warm-read ratio
/// to native and each scopefs daemon's peak RSS. `reports` maps a target's file stem to its report.
pub fn comparison_table(reports: &BTreeMap<String, TargetReport>) -> String {
    let secs: BTreeMap<&str, BTreeMap<&'static str, f64>> =
        reports.iter().map(|(t, r)| (t.as_str(), seconds_by_line(r))).collect();
    let get = |target: &str, line: &str| secs.get(target).and_then(|m| m.get(line)).copied();

    let mut header: Vec<String> = vec!["seconds".into()];
    header.extend(TARGETS.iter().map(|(_, title)| title.to_string()));
    header.extend(RATIOS.iter().map(|(title, _, _)| title.to_string()));
    let mut out = String::new();
    let mut push_row = |cells: &[String]| {
        out.push_str("| ");
        out.push_str(&cells.join(" | "));
        out.push_str(" |\n");
    };
    push_row(&header);
    push_row(&header.iter().map(|_| "---".to_string()).collect::<Vec<_>>());
    for line in LINES {
        let mut cells = vec![line.to_string()];
        cells.extend(TARGETS.iter().map(|(t, _)| cell(get(t, line))));
        cells.extend(RATIOS.iter().map(|(_, n, d)| cell(ratio(get(n, line), get(d, line)))));
        push_row(&cells);
    }

    let warm = |target: &str| cell(ratio(get(target, "W2 warm"), get("native", "W2 warm")));
    out.push_str(&format!(
        "\nwarm read scope/native: local {}, Garage {}\n",
        warm("scopefs-local"),
        warm("scopefs-garage")
    ));
    for (target, title) in &TARGETS[2..4] {
        let rss = reports.get(*target).and_then(|r| r.daemon_peak_rss_kib);
        out.push_str(&format!(
            "peak RSS of the daemon ({title}): {}\n",
            rss.map_or_else(|| "–".to_string(), |kib| format!("{:.1} MiB", kib as f64 / 1024.0))
        ));
    }
    out
}

/// Reads the known targets' reports from the results directory and prints the comparison.
pub fn run(args: &CompareArgs) -> Result<()> {
    let mut reports = BTreeMap::new();
    for (target, _) in TARGETS {
        let path = args.results.join(format!("{target}.json"));
        if !path.exists() {
            continue;
        }
        let text = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let report: TargetReport =
            serde_json::from_str(&text).with_context(|| format!("{} is not a bench JSON report", path.display()))?;
        reports.insert(target.to_string(), report);
    }
    ensure!(!reports.is_empty(), "no <target>.json report in {}", args.results.display());
    let mut sizes: Vec<(u64, u64)> = reports.values().map(|r| (r.size_mib, r.files)).collect();
    sizes.dedup();
    for (size_mib, files) in &sizes {
        println!("W1/W2: {size_mib} MiB, W3/W4: {files} files");
    }
    if sizes.len() > 1 {
        println!("warning: the targets ran with different sizes; the ratios compare unlike runs");
    }
    println!();
    print!("{}", comparison_table(&reports));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(secs: &[(&str, &str, f64)], rss: Option<u64>) -> TargetReport {
        TargetReport {
            size_mib: 256,
            files: 5000,
            rows: secs
                .iter()
                .map(|(w, n, s)| ReportRow { workload: w.to_string(), name: n.to_string(), seconds: *s })
                .collect(),
            daemon_peak_rss_kib: rss,
        }
    }

    fn full(scale: f64, rss: Option<u64>) -> TargetReport {
        report(
            &[
                ("W1", "sequential write + fsync", 1.0 * scale),
                ("W2", "sequential read, cold", 0.5 * scale),
                ("W2", "sequential read, warm", 0.25 * scale),
                ("W3", "create 4 KiB files", 4.0 * scale),
                ("W4", "stat files + list dirs", 0.1 * scale),
                ("W5", "unpack source tree", 2.0 * scale),
                ("W5", "git init + add -A + commit", 1.0 * scale),
                ("W6", "rm -rf everything", 3.0 * scale),
            ],
            rss,
        )
    }

    #[test]
    fn table_has_every_row_target_and_ratio() {
        let mut reports = BTreeMap::new();
        reports.insert("native".to_string(), full(0.5, None));
        reports.insert("bindfs".to_string(), full(2.0, None));
        reports.insert("scopefs-local".to_string(), full(1.0, Some(51_200)));
        reports.insert("scopefs-garage".to_string(), full(4.0, Some(102_400)));
        reports.insert("s3fs".to_string(), full(40.0, None));
        // rclone did not run: its column and ratio print as missing.
        let table = comparison_table(&reports);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| seconds | native | bindfs | scope, local | scope, Garage | s3fs | rclone | scope/bindfs local \
             | scope/bindfs Garage | s3fs/scope Garage | rclone/scope Garage |",
            "{table}"
        );
        assert_eq!(lines[1], "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        assert_eq!(lines[2], "| W1 | 0.50 | 2.00 | 1.00 | 4.00 | 40.00 | – | 0.50 | 2.00 | 10.00 | – |", "{table}");
        assert_eq!(lines[3], "| W2 cold | 0.25 | 1.00 | 0.50 | 2.00 | 20.00 | – | 0.50 | 2.00 | 10.00 | – |");
        assert_eq!(lines[4], "| W2 warm | 0.12 | 0.50 | 0.25 | 1.00 | 10.00 | – | 0.50 | 2.00 | 10.00 | – |");
        // W5 adds the unpack and the git steps.
        assert_eq!(lines[7], "| W5 | 1.50 | 6.00 | 3.00 | 12.00 | 120.00 | – | 0.50 | 2.00 | 10.00 | – |");
        assert_eq!(lines[8], "| W6 | 1.50 | 6.00 | 3.00 | 12.00 | 120.00 | – | 0.50 | 2.00 | 10.00 | – |");
        assert!(table.contains("\nwarm read scope/native: local 2.00, Garage 8.00\n"), "{table}");
        assert!(table.contains("peak RSS of the daemon (scope, local): 50.0 MiB\n"), "{table}");
        assert!(table.contains("peak RSS of the daemon (scope, Garage): 100.0 MiB\n"), "{table}");
    }

    #[test]
    fn missing_rows_and_zero_denominators_print_as_missing() {
        let mut reports = BTreeMap::new();
        reports.insert("bindfs".to_string(), report(&[("W3", "create 4 KiB files", 0.0)], None));
        reports.insert("scopefs-local".to_string(), report(&[("W3", "create 4 KiB files", 2.0)], None));
        let table = comparison_table(&reports);
        let w1 = table.lines().find(|l| l.starts_with("| W1 |")).expect("W1 row");
        assert_eq!(w1, "| W1 | – | – | – | – | – | – | – | – | – | – |");
        let w3 = table.lines().find(|l| l.starts_with("| W3 |")).expect("W3 row");
        assert_eq!(w3, "| W3 | – | 0.00 | 2.00 | – | – | – | – | – | – | – |");
        assert!(table.contains("peak RSS of the daemon (scope, local): –"), "{table}");
    }

    #[test]
    fn reads_reports_written_by_the_bench() {
        let json = r#"{"target":"bindfs","size_mib":2,"files":10,"rows":[{"workload":"W3","name":"create 4 KiB files",
            "ops":10,"bytes":40960,"seconds":0.5,"rate_kind":"ops","rate":20.0,"rate_unit":"ops/s"}],"notes":[]}"#;
        let report: TargetReport = serde_json::from_str(json).expect("parse");
        assert_eq!(seconds_by_line(&report).get("W3"), Some(&0.5));
        assert_eq!(report.daemon_peak_rss_kib, None);
    }
}
