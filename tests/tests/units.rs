//! The unit of the sampled event's values in profiles: the software
//! clocks' (`cpu-clock`, `task-clock`) are nanoseconds, so that `go tool
//! pprof` shows their profiles as time; other events' (`page-faults`,
//! hardware and raw events) are counts.

use std::time::Duration;

use burstyd_tests::*;

/// The `Total samples = ...` of `go tool pprof -top -sample_index=TYPE`.
fn pprof_total(path: &std::path::Path, sample_index: &str) -> String {
    let (header, _) = gopprof::top(path, Some(sample_index)).unwrap_or_else(|e| panic!("{e:#}"));
    let line = header
        .iter()
        .find(|l| l.contains("Total samples = "))
        .unwrap_or_else(|| panic!("no `Total samples` in {header:#?}"));
    let rest = line.split("Total samples = ").nth(1).unwrap();
    rest.split_whitespace().next().unwrap().to_string()
}

/// Seconds from pprof's rendering of a time ("1.98s", "850ms", "2.01mins").
fn seconds(shown: &str) -> Option<f64> {
    let split = shown.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = shown.split_at(split);
    let n: f64 = n.parse().ok()?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "mins" => 60.0,
        _ => return None,
    };
    Some(n * scale)
}

/// `run -e cpu-clock` over `spinner 2` (two seconds of CPU): the
/// profile's event sample type and period type are
/// `cpu-clock/nanoseconds`, its values sum to the spinner's CPU time (at
/// most the wall time), and `go tool pprof -top` shows that total as time.
#[test]
fn cpu_clock_profiles_are_in_nanoseconds_and_pprof_shows_time() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("units-clock");
    let spinner = fixture("spinner");
    let run = burstyd_run(
        &scratch,
        &["-e", "cpu-clock", "--freq", "499", "--no-bursts"],
        &[spinner.to_str().unwrap(), "2"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    let p = run.profile();
    assert_contract_shape(&p, "cpu-clock");
    let i = p.value_index("cpu-clock").unwrap();
    assert_eq!(p.sample_types[i].1, "nanoseconds");
    let ns: i64 = p.samples.iter().map(|s| s.values[i]).sum();
    let secs = ns as f64 / 1e9;
    // At most the run's wall time (one thread), and a good part of the 2 s
    // unless other work crowds the CPUs out.
    let wall = run.finished.elapsed.as_secs_f64();
    assert!(
        (0.2..=wall).contains(&secs),
        "cpu-clock values sum to {ns} ns for 2 s of spinning ({wall:.2} s of wall time)"
    );
    let shown = pprof_total(&run.profile_path(), "cpu-clock");
    let pprof_secs = seconds(&shown).unwrap_or_else(|| {
        panic!("go tool pprof shows the cpu-clock total as {shown:?}, not a time")
    });
    assert!(
        (pprof_secs - secs).abs() <= 0.01 * secs,
        "pprof shows {shown}, the profile holds {secs} s"
    );
}

/// `run -e page-faults --period 1`: every page fault is one sample, the
/// event's type is `page-faults/count`, and pprof shows a plain count.
#[test]
fn page_fault_profiles_are_counts() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("units-faults");
    let spinner = fixture("spinner");
    let run = burstyd_run(
        &scratch,
        &["-e", "page-faults", "--period", "1", "--no-bursts"],
        &[spinner.to_str().unwrap(), "0.2"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    let p = run.profile();
    assert_contract_shape(&p, "page-faults");
    let i = p.value_index("page-faults").unwrap();
    let faults: i64 = p.samples.iter().map(|s| s.values[i]).sum();
    assert_eq!(
        faults,
        p.total_samples(),
        "--period 1: one fault per sample"
    );
    let shown = pprof_total(&run.profile_path(), "page-faults");
    assert_eq!(shown, faults.to_string(), "go tool pprof's total");
}
