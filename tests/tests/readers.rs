//! Self-tests of the profile readers (no root, no daemon): a synthetic
//! profile is written with prost, then read back directly and through
//! `go tool pprof -traces/-top`.

use burstyd_tests::{Scratch, gopprof, pprof};

fn synthetic(scratch: &Scratch) -> std::path::PathBuf {
    let p = pprof::synthetic_profile(&[
        (
            vec!["hot_leaf", "func_b", "func_a", "main", "_start"],
            7,
            vec![
                ("pid", "4242"),
                ("comm", "call_chain"),
                ("thread", "call_chain"),
                ("tid", "4242"),
            ],
        ),
        (
            vec!["spin_alpha_work", "start_thread", "clone3"],
            3,
            vec![
                ("pid", "17"),
                ("comm", "threads"),
                ("thread", "spin-alpha"),
                ("tid", "18"),
            ],
        ),
        (
            vec![
                "std::vector<int, std::allocator<int> >::push_back(int const&)",
                "main",
            ],
            2,
            vec![
                ("pid", "17"),
                ("comm", "a very long comm"),
                ("thread", "with spaces"),
                ("tid", "19"),
            ],
        ),
    ]);
    let path = scratch.join("synthetic.pb.gz");
    pprof::write_profile_gz(&p, &path).unwrap();
    path
}

#[test]
fn direct_decoder_round_trip() {
    let scratch = Scratch::new("readers-direct");
    let p = pprof::read_profile(&synthetic(&scratch)).unwrap();
    assert_eq!(
        p.sample_types,
        vec![
            ("samples".to_string(), "count".to_string()),
            ("cpu-clock".to_string(), "nanoseconds".to_string())
        ]
    );
    burstyd_tests::assert_contract_shape(&p, "cpu-clock");
    assert_eq!(p.samples.len(), 3);
    assert_eq!(
        p.samples[0].names(),
        ["hot_leaf", "func_b", "func_a", "main", "_start"]
    );
    assert_eq!(p.samples[0].pid(), Some(4242));
    assert_eq!(p.samples[1].label("thread"), Some("spin-alpha"));
    assert_eq!(p.samples[1].num_labels["tid"], 18);
    assert_eq!(p.samples[0].frames[0].mapping_file, "/bin/synthetic");
    assert_eq!(p.total_samples(), 12);
}

#[test]
fn go_pprof_traces_parse() {
    let scratch = Scratch::new("readers-traces");
    let path = synthetic(&scratch);
    let (header, traces) = gopprof::traces(&path, Some("samples")).unwrap();
    eprintln!("{}", gopprof::run_pprof(&path, &["-traces"]).unwrap());
    assert!(
        header.iter().any(|h| h.starts_with("Type: samples")),
        "header: {header:?}"
    );
    assert_eq!(traces.len(), 3, "{traces:#?}");
    let t0 = traces
        .iter()
        .find(|t| t.label("pid") == Some("4242"))
        .unwrap();
    assert_eq!(
        t0.frames,
        ["hot_leaf", "func_b", "func_a", "main", "_start"]
    );
    assert_eq!(t0.count(), 7);
    assert!(t0.has_chain(&["hot_leaf", "func_b", "func_a", "main"]));
    assert!(!t0.has_chain(&["hot_leaf", "func_a"]));
    assert_eq!(t0.label("comm"), Some("call_chain"));
    assert_eq!(t0.label("tid"), Some("4242"));
    let t2 = traces
        .iter()
        .find(|t| t.label("tid") == Some("19"))
        .unwrap();
    assert_eq!(
        t2.frames[0],
        "std::vector<int, std::allocator<int> >::push_back(int const&)"
    );
    assert_eq!(t2.label("thread"), Some("with spaces"));
    assert_eq!(t2.label("comm"), Some("a very long comm"));
}

#[test]
fn go_pprof_top_parse() {
    let scratch = Scratch::new("readers-top");
    let path = synthetic(&scratch);
    eprintln!("{}", gopprof::run_pprof(&path, &["-top"]).unwrap());
    let (_, rows) = gopprof::top(&path, Some("samples")).unwrap();
    assert_eq!(rows[0].name, "hot_leaf");
    assert_eq!(rows[0].flat, "7");
    assert!((rows[0].flat_pct - 58.33).abs() < 0.01, "{rows:?}");
    assert!(
        rows.iter()
            .any(|r| r.name == "main" && (r.cum_pct - 75.0).abs() < 0.01),
        "{rows:?}"
    );
}

#[test]
fn go_pprof_warnings_fail() {
    // A profile whose mapping lacks functions makes pprof try to symbolize
    // unless -symbolize=none; our runner must not print warnings for it.
    let scratch = Scratch::new("readers-warn");
    let mut p = pprof::synthetic_profile(&[(vec!["f"], 1, vec![("pid", "1")])]);
    p.mapping[0].has_functions = false;
    let path = scratch.join("nofuncs.pb.gz");
    pprof::write_profile_gz(&p, &path).unwrap();
    gopprof::traces(&path, None).unwrap();
    // A garbage file makes pprof fail: the runner reports it.
    let bad = scratch.join("bad.pb.gz");
    std::fs::write(&bad, b"not a profile").unwrap();
    assert!(gopprof::traces(&bad, None).is_err());
}
