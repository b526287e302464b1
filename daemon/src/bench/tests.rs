//! Unit tests of `scopefs bench`: argument parsing, the report table and small workload runs.

use std::fs;
use std::path::{Path, PathBuf};

use super::workloads::{crate_name, create_small_files, read_file, remove_tree, write_big_file, Bench};
use super::*;
use clap::Parser;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

#[test]
fn parses_workload_list_and_sizes() {
    let cli =
        Cli::try_parse_from(["bench", "/mnt/x", "--only", "W1,w3", "--size-mib", "64", "--files", "500", "--json"])
            .expect("valid arguments");
    assert_eq!(cli.bench.dir, Some(PathBuf::from("/mnt/x")));
    assert_eq!(cli.bench.only, vec![Workload::W1, Workload::W3]);
    assert_eq!(cli.bench.size_mib, 64);
    assert_eq!(cli.bench.files, 500);
    assert!(cli.bench.json);

    let defaults = Cli::try_parse_from(["bench", "/d"]).expect("defaults");
    assert!(defaults.bench.only.is_empty());
    assert_eq!((defaults.bench.size_mib, defaults.bench.files), (1024, 10_000));
    assert!(Cli::try_parse_from(["bench", "/d", "--only", "W9"]).is_err());
    assert!(Cli::try_parse_from(["bench"]).is_err(), "DIR is required without a mode");

    let cmp = Cli::try_parse_from(["bench", "compare", "/results"]).expect("compare mode");
    match cmp.bench.mode {
        Some(BenchMode::Compare(c)) => assert_eq!(c.results, PathBuf::from("/results")),
        other => panic!("expected the compare mode, got {other:?}"),
    }
    let labelled = Cli::try_parse_from(["bench", "/d", "--label", "bindfs", "--daemon-pid", "42"]).expect("label");
    assert_eq!((labelled.bench.label.as_deref(), labelled.bench.daemon_pid), (Some("bindfs"), Some(42)));
    let watched = Cli::try_parse_from(["bench", "/d", "--cpu-pid", "7", "--cpu-pid", "9"]).expect("cpu pids");
    assert_eq!(watched.bench.cpu_pids, vec![7, 9]);
}

#[test]
fn peak_rss_comes_from_vm_hwm() {
    let status = "Name:\tscopefs\nVmPeak:\t  900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40000 kB\n";
    assert_eq!(parse_vm_hwm(status), Some(51_200));
    assert_eq!(parse_vm_hwm("Name:\tx\n"), None);
    let own = peak_rss_kib(std::process::id()).expect("own VmHWM");
    assert!(own > 0);
}

#[test]
fn table_aligns_columns_and_reports_rates() {
    let rows = vec![
        Row {
            workload: "W1".into(),
            name: "sequential write + fsync".into(),
            ops: 64,
            bytes: 64 * MIB,
            seconds: 0.5,
            rate_kind: RateKind::Bytes,
        },
        Row {
            workload: "W3".into(),
            name: "create 4 KiB files".into(),
            ops: 500,
            bytes: 500 * 4096,
            seconds: 2.0,
            rate_kind: RateKind::Ops,
        },
    ];
    let table = format_table(&rows);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(lines[0].starts_with("workload  step"), "{table}");
    assert!(lines[2].ends_with("128.0 MiB/s"), "{table}");
    assert!(lines[3].ends_with("250 ops/s"), "{table}");
    // The seconds column lines up.
    let col = |l: &str| l.find("0.500").or_else(|| l.find("2.000"));
    assert_eq!(col(lines[2]), col(lines[3]), "{table}");
}

#[test]
fn crate_names_strip_versions() {
    assert_eq!(crate_name(Path::new("/x/tokio-1.54.1")).as_deref(), Some("tokio"));
    assert_eq!(crate_name(Path::new("/x/aws-sdk-s3-1.157.0")).as_deref(), Some("aws-sdk-s3"));
    assert_eq!(crate_name(Path::new("/x/noversion")), None);
}

#[test]
fn small_run_creates_measures_and_removes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let args = BenchArgs {
        mode: None,
        dir: Some(tmp.path().to_path_buf()),
        only: vec![Workload::W6, Workload::W7, Workload::W8, Workload::W1, Workload::W2, Workload::W3, Workload::W4],
        size_mib: 2,
        files: 150,
        streams: 3,
        tree: None,
        json: true,
        keep: false,
        label: Some("native".into()),
        daemon_pid: Some(std::process::id()),
        cpu_pids: vec![std::process::id()],
        scopes: None,
    };
    run(args).expect("bench run");
    let left: Vec<_> = fs::read_dir(tmp.path()).expect("list").collect();
    assert!(left.is_empty(), "W6 must remove the work directory");
}

#[test]
fn workloads_count_what_they_do() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (ops, bytes, _) = write_big_file(&tmp.path().join("big"), 3).expect("write");
    assert_eq!((ops, bytes), (3, 3 * MIB));
    let (_, read, _) = read_file(&tmp.path().join("big")).expect("read");
    assert_eq!(read, 3 * MIB);
    let (ops, bytes, _) = create_small_files(&tmp.path().join("w3"), 250).expect("create");
    assert_eq!((ops, bytes), (250 + 100, 250 * 4096));
    // 250 files + 100 dirs + w3 itself.
    assert_eq!(remove_tree(&tmp.path().join("w3")).expect("remove"), 351);
    assert!(!tmp.path().join("w3").exists());
}

#[test]
fn parallel_writers_write_their_share_and_leave_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = tmp.path().join("work");
    fs::create_dir(&work).expect("work dir");
    let mut bench = Bench {
        work: work.clone(),
        size_mib: 6,
        files: 1,
        streams: 3,
        tree: None,
        rows: Vec::new(),
        notes: Vec::new(),
        big_written: false,
        small_written: false,
        cpu_pids: vec![std::process::id()],
        cpu: Vec::new(),
    };
    bench.run_all(&[Workload::W7]).expect("W7");
    let charged: Vec<(&str, usize)> = bench.cpu.iter().map(|c| (c.workload.as_str(), c.seconds.len())).collect();
    assert_eq!(charged, vec![("W7", 1)], "each workload charged with each watched pid's CPU time");
    let row = &bench.rows[0];
    assert_eq!((row.workload.as_str(), row.ops, row.bytes), ("W7", 6, 6 * MIB));
    assert_eq!(row.name, "3 parallel sequential writes + fsync");
    assert!(work.exists(), "W7 keeps a work directory it did not create");
    assert_eq!(fs::read_dir(&work).expect("list").count(), 0, "W7 removes its files");
    bench.run_all(&[Workload::W8]).expect("W8");
    let (p50, p99) = (&bench.rows[1], &bench.rows[2]);
    assert_eq!((p50.workload.as_str(), p99.workload.as_str()), ("W8", "W8"));
    assert!(p50.name.ends_with("p50") && p99.name.ends_with("p99"));
    assert!(p50.seconds > 0.0 && p50.seconds <= p99.seconds, "{} > {}", p50.seconds, p99.seconds);
    assert_eq!(fs::read_dir(&work).expect("list").count(), 0, "W8 removes its files");
}
