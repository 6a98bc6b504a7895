//! Hot data streams of a complete trace recorded by a tool that shares no
//! code with burstyd (valgrind's lackey, `--trace-mem=yes`, turned into
//! the plain-text trace by `bench_tool lackey-trace`), on `streams`, whose
//! streams are known by construction: its hot list walked `rounds × 4`
//! times (24 references a walk: a node's value and next pointer), its cold
//! one `ceil(rounds / 8)` times, random noise between.
use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;

#[test]
fn a_lackey_trace_gives_the_known_streams() {
    let exe = fixture("streams");
    let scratch = Scratch::new("hot-streams-lackey");
    let log = scratch.join("lackey.log");
    let rounds = 200u64;
    let run = run_timeout(
        Command::new(installed("/usr/bin/valgrind", "valgrind"))
            .args(["--tool=lackey", "--trace-mem=yes", "-v", "-v", "-v"])
            .arg(format!("--log-file={}", log.display()))
            .arg(&exe)
            .arg(rounds.to_string()),
        Duration::from_secs(300),
    );
    assert!(run.status.success(), "{}", run.describe());
    let (hot_refs, cold_refs, _) = constructed(&run.stdout_str());
    let trace = scratch.join("trace.txt");
    let conv = run_timeout(
        Command::new(env!("CARGO_BIN_EXE_bench_tool"))
            .arg("lackey-trace")
            .arg(&log),
        Duration::from_secs(300),
    );
    assert!(conv.status.success(), "{}", conv.describe());
    std::fs::write(&trace, &conv.stdout).unwrap();
    let report = run_timeout(
        Command::new(burstyd_bin())
            .args(["hot-streams", "--json", "--from-trace"])
            .arg(&trace),
        Duration::from_secs(300),
    );
    assert!(report.status.success(), "{}", report.describe());
    let r: serde_json::Value = serde_json::from_str(&report.stdout_str()).unwrap();
    let total = r["references"].as_u64().unwrap();
    let streams = r["streams"].as_array().unwrap();
    // The references the streams account for by the sites of one
    // function (occurrences × its sites in the signature), and the most
    // frequent stream all of whose sites are in it.
    let of = |f: &str| {
        let refs: u64 = streams
            .iter()
            .map(|s| {
                let sites = s["signature"].as_array().unwrap();
                let mine = sites.iter().filter(|site| site["function"] == f).count() as u64;
                mine * s["frequency"].as_u64().unwrap()
            })
            .sum();
        let top = streams
            .iter()
            .filter(|s| {
                let sites = s["signature"].as_array().unwrap();
                sites.iter().all(|site| site["function"] == f)
            })
            .map(|s| s["frequency"].as_u64().unwrap())
            .max()
            .unwrap_or(0);
        (refs, top)
    };
    let describe = || {
        streams
            .iter()
            .take(8)
            .map(|s| {
                format!(
                    "{} x{} len {} in {}",
                    s["heat"], s["frequency"], s["length"], s["signature"][0]["function"]
                )
            })
            .collect::<Vec<_>>()
            .join("\n  ")
    };
    // Every reference of every walk (but the first, see below) is in a
    // hot stream, and the hot walk
    // is one stream, as often as it was walked but for the walks right
    // after a cold one (one in 8 rounds): the grammar's cuts depend on
    // the references around, and the cold walk, always followed by a hot
    // one, may share a stream with it.
    // (The very first walk follows the start-up's references and may be
    // cut apart from the rest: a variant seen once is no stream.)
    let (hot, hot_top) = of("walk_hot");
    let cold_walks = rounds.div_ceil(8);
    assert!(
        (hot_refs - 24..=hot_refs).contains(&hot),
        "hot walk {hot} of {hot_refs}:\n  {}",
        describe()
    );
    assert!(
        (rounds * 4 - cold_walks..=rounds * 4).contains(&hot_top),
        "hot walk {hot_top} times:\n  {}",
        describe()
    );
    let (cold, _) = of("walk_cold");
    assert!(
        (cold_refs - 24..=cold_refs).contains(&cold),
        "cold walk {cold} of {cold_refs}:\n  {}",
        describe()
    );
    // The hottest stream is the hot walk; noise never repeats.
    assert_eq!(streams[0]["signature"][0]["function"], "walk_hot");
    assert_eq!(streams[0]["length"], 24);
    let share = streams[0]["heat"].as_f64().unwrap();
    assert_eq!((share * total as f64).round() as u64, hot_top * 24);
    assert_eq!(streams[0]["pattern"], "irregular");
    assert!(
        streams.iter().all(|s| s["signature"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["function"] != "noise")),
        "{}",
        describe()
    );
    // The module is named with its build ID and static addresses.
    let site = &streams[0]["signature"][0];
    assert_eq!(site["module"], exe.to_str().unwrap());
    assert_eq!(site["build_id"].as_str(), elf_build_id(&exe).as_deref());
    assert!(site["line"].as_str().unwrap().starts_with("streams.c:"));
}

/// `streams`' reference counts by construction ("references hot H cold C
/// noise N").
fn constructed(stdout: &str) -> (u64, u64, u64) {
    let c: Vec<u64> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("references "))
        .unwrap()
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (c[0], c[1], c[2])
}

/// Bursts in memory mode (`--record refs`) find `streams`' hot walk as
/// the hottest stream, with its 24 references in order (a node's value,
/// then its next pointer, in `walk_hot`), at its share of all references
/// by construction within 5 points, under `run` and under `--pid`; the
/// seed `noise` updates through a pointer into `main`'s frame is the
/// thread's stack and is left out; nothing is lost; the traced output is
/// the untraced one. `burstyd hot-streams OUT --json` reads the same
/// report back.
#[test]
fn bursts_in_memory_mode_find_the_known_streams() {
    require_root();
    let _serial = serial();
    let exe = fixture("streams");
    let exe_s = exe.to_str().unwrap();
    let rounds = "1000000";
    let untraced = run_untraced(&[exe_s, rounds], Duration::from_secs(120));
    let (hot, cold, noise) = constructed(&untraced.stdout_str());
    let truth = hot as f64 / (hot + cold + noise) as f64;

    let scratch = Scratch::new("hot-streams-run");
    let run = burstyd_run(
        &scratch,
        &["--record", "refs"],
        &[exe_s, rounds],
        Duration::from_secs(300),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let mut outs = vec![("run", run.out_dir.clone())];

    let scratch = Scratch::new("hot-streams-pid");
    let target = Background::spawn(Command::new(exe_s).arg("1000000000"));
    target.wait_exec(&exe);
    let pid = target.pid().to_string();
    let run = burstyd(
        &scratch,
        &["--pid", &pid, "--duration", "3", "--record", "refs"],
        &[],
        Duration::from_secs(120),
    );
    run.assert_ok();
    drop(target);
    outs.push(("--pid", run.out_dir.clone()));

    for (how, out) in &outs {
        let summary = read_summary(out);
        assert_eq!(summary.traced().records_lost(), 0, "{how}");
        let read = summary.traced().references();
        let text = std::fs::read_to_string(out.join("hot-streams.json"))
            .unwrap_or_else(|e| panic!("{how}: hot-streams.json: {e}"));
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        // Every reference read went into the analysis or was counted
        // out of it (whole bursts beyond the analysis rate).
        let analysed = r["references"].as_u64().unwrap();
        let dropped = r["dropped"].as_u64().unwrap_or(0);
        assert_eq!(analysed + dropped, read, "{how}");
        assert!(analysed > 10_000, "{how}: {analysed} references");
        let streams = r["streams"].as_array().unwrap();
        let top = &streams[0];
        let sites: Vec<(&str, &str)> = top["signature"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["function"].as_str().unwrap_or("?"),
                    s["address"].as_str().unwrap(),
                )
            })
            .collect();
        let why = format!(
            "{how}: {} references, top stream {} x{} {:?}",
            r["references"], top["heat"], top["frequency"], sites
        );
        assert_eq!(top["length"], 24, "{why}");
        assert!(sites.iter().all(|(f, _)| *f == "walk_hot"), "{why}");
        // Two instructions, alternating: the value's load, the next's.
        assert_ne!(sites[0].1, sites[1].1, "{why}");
        assert!(sites.chunks(2).all(|p| p == &sites[..2]), "{why}");
        assert_eq!(top["signature"][0]["module"], exe_s, "{why}");
        let share = top["heat"].as_f64().unwrap();
        assert!(
            (share - truth).abs() <= 0.05,
            "{why}: share {share:.3}, by construction {truth:.3}"
        );
        assert!(
            streams.iter().all(|s| s["signature"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x["address"].as_str() != Some("0x0"))),
            "{why}"
        );
        // The readable report's JSON is the file's.
        let shown = run_timeout(
            Command::new(burstyd_bin())
                .args(["hot-streams", "--json"])
                .arg(out),
            Duration::from_secs(60),
        );
        assert!(shown.status.success(), "{}", shown.describe());
        let back: serde_json::Value = serde_json::from_str(&shown.stdout_str()).unwrap();
        assert_eq!(back, r, "{how}");
    }
}

/// Memory mode on programs nobody here wrote: xz compressing 2 MB and
/// sqlite3 building, grouping and joining a table, with bursts at 999 Hz,
/// write what they write untraced, and their bursts recorded references.
#[test]
fn memory_mode_leaves_real_programs_unchanged() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("hot-streams-real");
    let input = scratch.join("input");
    let python = std::fs::read(installed("/usr/bin/python3.11", "python3.11")).unwrap();
    std::fs::write(&input, &python[..python.len().min(2 << 20)]).unwrap();
    let sql = scratch.join("q.sql");
    std::fs::write(
        &sql,
        "create table t(k integer primary key, v text, n integer);\n\
         with recursive c(i) as (select 1 union all select i + 1 from c where i < 30000)\n\
         insert into t select i, printf('%08x', i * 2654435761 % 4294967296), (i * 7919) % 1000 from c;\n\
         select n, count(*), sum(k), max(v) from t group by n order by 2 desc, 1 limit 5;\n\
         select count(*) from t a join t b on a.n = b.n where a.k < 200;\n",
    )
    .unwrap();
    let xz = installed("/usr/bin/xz", "xz-utils");
    let sqlite = installed("/usr/bin/sqlite3", "sqlite3");
    let (input_s, sql_s) = (input.to_str().unwrap(), sql.to_str().unwrap());
    let progs: [&[&str]; 2] = [
        &[xz, "-6", "-c", "-T1", input_s],
        &[sqlite, ":memory:", "-init", sql_s, ".quit"],
    ];
    for prog in progs {
        let untraced = run_untraced(prog, Duration::from_secs(120));
        let sub = Scratch::new("hot-streams-real-run");
        let run = burstyd_run(
            &sub,
            &["--record", "refs", "--freq", "999"],
            prog,
            Duration::from_secs(300),
        );
        run.assert_ok();
        assert!(
            run.finished.stdout == untraced.stdout,
            "{}: the traced output differs",
            prog[0]
        );
        let refs = read_summary(&run.out_dir).traced().references();
        assert!(refs > 1000, "{}: {refs} references", prog[0]);
    }
}

/// burstyd's complete trace in memory mode (`run --full-trace --record
/// refs --save-bursts`) against valgrind lackey's of the same command
/// (`bench_tool lackey-trace --from-entry`, its stack references and
/// repeated string iterations left out as burstyd leaves them out): every
/// instruction of the executable makes as many references in both, over
/// plain loads and stores, read-modify-writes, call targets loaded through
/// a table and through the PLT, thread-local data and the stack
/// protector's canary (fs-relative), a switch's table and string
/// operations (`refs_known.c`); over every module (libc's too), the totals
/// agree within 1%. Both runs bind every symbol at start (a lazily bound
/// PLT slot pauses a burst in the loader) and keep glibc off its AVX-512
/// string functions (valgrind's CPU has none, so its IFUNCs pick others).
#[test]
fn a_full_trace_records_what_lackey_sees() {
    require_root();
    let _serial = serial();
    let exe = fixture("refs_known");
    let exe_s = exe.to_str().unwrap();
    let rounds = "3000";
    let env = [
        ("LD_BIND_NOW", "1"),
        (
            "GLIBC_TUNABLES",
            "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD",
        ),
    ];
    let scratch = Scratch::new("refs-vs-lackey");
    let log = scratch.join("lackey.log");
    let lackey = run_timeout(
        Command::new(installed("/usr/bin/valgrind", "valgrind"))
            .envs(env)
            .args(["--tool=lackey", "--trace-mem=yes", "-v", "-v", "-v"])
            .arg(format!("--log-file={}", log.display()))
            .args([exe_s, rounds]),
        Duration::from_secs(300),
    );
    assert!(lackey.status.success(), "{}", lackey.describe());
    let conv = run_timeout(
        Command::new(env!("CARGO_BIN_EXE_bench_tool"))
            .args(["lackey-trace", "--from-entry"])
            .arg(&log),
        Duration::from_secs(300),
    );
    assert!(conv.status.success(), "{}", conv.describe());
    let out = scratch.join("out");
    let run = run_timeout(
        Command::new(burstyd_bin())
            .envs(env)
            .args([
                "run",
                "--full-trace",
                "--record",
                "refs",
                "--save-bursts",
                "-o",
            ])
            .arg(&out)
            .args(["--", exe_s, rounds]),
        Duration::from_secs(300),
    );
    assert!(run.status.success(), "{}", run.describe());
    assert_eq!(run.stdout_str(), lackey.stdout_str());
    let saved = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("references-"))
        })
        .expect("references-<pid>.txt");
    let count = |text: &str| {
        let mut by_pc: std::collections::BTreeMap<(String, u64), u64> = Default::default();
        for l in text.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if let [m, pc, _] = f[..] {
                *by_pc
                    .entry((m.to_owned(), u64::from_str_radix(pc, 16).unwrap()))
                    .or_default() += 1;
            }
        }
        by_pc
    };
    let ours = count(&std::fs::read_to_string(&saved).unwrap());
    let theirs = count(&conv.stdout_str());
    let in_exe = |c: &std::collections::BTreeMap<(String, u64), u64>| {
        c.iter()
            .filter(|((m, _), _)| m == exe_s)
            .map(|((_, pc), n)| (*pc, *n))
            .collect::<Vec<_>>()
    };
    let (a, b) = (in_exe(&ours), in_exe(&theirs));
    assert!(
        b.len() >= 20,
        "lackey saw {} instructions of the fixture",
        b.len()
    );
    let show = |v: &[(u64, u64)]| {
        v.iter()
            .map(|(pc, n)| format!("{pc:#x}:{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(a, b, "\nburstyd {}\nlackey  {}", show(&a), show(&b));
    let total = |c: &std::collections::BTreeMap<(String, u64), u64>| c.values().sum::<u64>();
    let (x, y) = (total(&ours) as f64, total(&theirs) as f64);
    assert!(
        (x / y - 1.0).abs() < 0.01,
        "references: burstyd {x}, lackey {y}"
    );
}
