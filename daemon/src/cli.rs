//! Command line (clap derive).
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  burstyd --pid 1234 --event cache-misses --duration 30 -o out/   one process (and its threads)
  burstyd --duration 30 -o out/                                   every process on the host
  burstyd run -o out/ -- ./prog args                              launch a command and profile it
  burstyd --pid 1234 --burst 200 --period 2000000 -o out/         bursty tracing: paths.pb.gz beside context.pb.gz
  burstyd run --full-trace -o out/ -- ./prog                      every path, for ground truth (slow)
  go tool pprof -top out/context.pb.gz                            read the result
  burstyd analyze /usr/bin/xz                                     what the rewriter sees in a binary
  burstyd analyze --function main --dot ./prog | dot -Tsvg        one function's CFG
  burstyd analyze ./prog --profile out/context.pb.gz              hot coverage: samples in instrumented code
  burstyd hot-paths out/paths.pb.gz                               hot paths: how few paths hold most of the event

As a service (see systemd/burstyd.toml for every key):
  burstyd --config /etc/burstyd/burstyd.toml                      targets, output, HTTP, push from the file
  burstyd --http 127.0.0.1:6060 --interval 60 -o /var/lib/burstyd  serve pprof and /metrics over HTTP
  go tool pprof http://127.0.0.1:6060/debug/pprof/profile?seconds=10   the next 10 s, from the endpoint
  curl -s http://127.0.0.1:6060/metrics                           samples, drops, pushes, daemon CPU/RSS
  kill -HUP $(pidof burstyd)                                      reload the file (a bad one is rejected)

  # burstyd.toml: sample /usr/bin/foo whenever it runs, push to Pyroscope
  [output]
  dir = \"/var/lib/burstyd\"
  interval = \"60s\"
  keep = 1440
  [http]
  listen = \"127.0.0.1:6060\"
  [[target]]
  exe = \"/usr/bin/foo\"
  [[push]]
  kind = \"pyroscope\"
  url = \"http://pyroscope:4040\"
  app = \"foo\"
  labels = { env = \"prod\" }

Events: cycles, instructions, cache-misses, cache-references, branch-misses,
branch-instructions, cpu-clock, task-clock, page-faults, rNNNN (raw PMU event).
Hardware events fall back to cpu-clock on hosts without a PMU (logged, and
recorded in the profile).";

#[derive(Debug, Parser)]
#[command(
    name = "burstyd",
    version,
    about = "Near-zero-overhead profiler for native programs: eBPF stack sampling on PMU overflow, calling context trees, pprof output",
    after_help = EXAMPLES,
    // A profiling flag before a subcommand (`burstyd -F 999 run ...`,
    // `burstyd --http X analyze F`) would be silently ignored: refuse it.
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,

    /// Profile only this process and its threads (repeatable). Without
    /// --pid (and without `run`), every process on the host is sampled.
    #[arg(short, long = "pid", value_name = "PID", value_parser = parse_pid)]
    pub(crate) pids: Vec<u32>,

    #[command(flatten)]
    pub(crate) service: ServiceArgs,

    #[command(flatten)]
    pub(crate) profile: ProfileArgs,
}

/// A `--pid`: a positive number (0 is no process: kill(0, ...) means
/// "my own process group").
fn parse_pid(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("0 is not a process id (pids start at 1)".into()),
        Ok(p) => Ok(p),
        Err(e) => Err(format!("{e}")),
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Launch a command and profile it until it exits; burstyd then exits
    /// with the command's exit status.
    Run {
        #[command(flatten)]
        profile: ProfileArgs,
        #[command(flatten)]
        service: ServiceArgs,
        /// Start the command at once. By default, with bursts, it is held
        /// at its entry point (after the dynamic loader mapped its
        /// libraries) until its clones are in place, so that bursts cover
        /// it from its first instruction; its start is delayed by the
        /// analysis (about a second per 3 MB of code). With --no-hold it
        /// runs meanwhile and bursts begin once the analysis is done.
        #[arg(long)]
        no_hold: bool,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Analyse an x86-64 ELF file the way the rewriter will (functions, CFGs,
    /// loops, Ball-Larus paths, check placement); touches no process.
    Analyze {
        /// The ELF executable or shared library.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Report on one function only.
        #[arg(long, value_name = "NAME")]
        function: Option<String>,
        /// The CFG of --function as Graphviz.
        #[arg(long, requires = "function")]
        dot: bool,
        /// Also write the full plan (CFGs, path numberings) as JSON here.
        #[arg(long, value_name = "FILE")]
        plan: Option<PathBuf>,
        /// Hot coverage: weigh the functions by the samples of this pprof
        /// profile (burstyd's context.pb.gz of a run of FILE): what share
        /// of FILE's samples land in functions the rewriter instruments,
        /// and which uninstrumented ones are sampled most, and why.
        #[arg(long, value_name = "PROFILE", conflicts_with_all = ["function", "dot"])]
        profile: Option<PathBuf>,
        /// Loops with no calls and at most K memory references are k-boring
        /// (no instrumentation, no back-edge check).
        #[arg(short, long, default_value_t = userspace_rewriter::analysis::plan::DEFAULT_K)]
        k: u64,
    },
    /// The hot paths of a path profile (burstyd's paths.pb.gz): how
    /// concentrated a metric is (how few paths hold 50, 90 and 99% of it),
    /// the paths that each hold at least --threshold percent of it, dense
    /// (above the average rate per execution) and sparse, and the hottest
    /// paths; as Ammons, Ball & Larus report hot paths.
    HotPaths {
        /// The path profile (paths.pb.gz of `burstyd run` or `--pid`).
        #[arg(value_name = "PATHS_PROFILE")]
        profile: PathBuf,
        /// The sample type to rank by (`executions`, the sampled event's
        /// estimate, e.g. `cpu-clock`, or with --path-time
        /// `measured-time`); default: the profile's default type (the
        /// measured time when bursts ran with --path-time), else its last
        /// one.
        #[arg(long, value_name = "TYPE")]
        metric: Option<String>,
        /// A path is hot when it holds at least this percent of the metric.
        #[arg(long, value_name = "PCT", default_value_t = 1.0)]
        threshold: f64,
        /// How many of the hottest paths to list.
        #[arg(long, value_name = "N", default_value_t = 20)]
        top: usize,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// The hot data streams of a data reference trace (Chilimbi's: the
    /// repeated reference sequences that account for most of it, found
    /// with a locally consistent grammar; Hirzel & Chilimbi's case study for bursty
    /// tracing): each stream's access signature (its instructions, with
    /// functions and lines), its share of all references, how often it
    /// occurs, and what its addresses do.
    HotStreams {
        /// A run's output directory (its `hot-streams.json`, written with
        /// `--record refs`), or one `hot-streams*.json` file: the streams
        /// as found then (--min-len, --max-len and --coverage do not
        /// apply).
        #[arg(value_name = "OUT", required_unless_present = "from_trace")]
        profile: Option<PathBuf>,
        /// A complete trace from another tool, one reference a line:
        /// `<module path> <static vaddr hex> <data address hex>`, an empty
        /// line between independent sequences (`bench_tool lackey-trace`
        /// makes one from valgrind lackey's `--trace-mem=yes`; `run
        /// --save-bursts` in memory mode writes burstyd's own).
        #[arg(long, value_name = "FILE", conflicts_with = "profile")]
        from_trace: Option<PathBuf>,
        /// The shortest stream reported, in references.
        #[arg(long, value_name = "N", default_value_t = 10)]
        min_len: u64,
        /// The longest stream reported, in references.
        #[arg(long, value_name = "N", default_value_t = 40)]
        max_len: u64,
        /// The heat threshold is set so that the hot streams together
        /// account for this percent of the references (or as many as
        /// there are, if they never do).
        #[arg(long, value_name = "PCT", default_value_t = 90.0)]
        coverage: f64,
        /// How many of the hottest streams to list.
        #[arg(long, value_name = "N", default_value_t = 20)]
        top: usize,
        /// Machine-readable output (every hot stream).
        #[arg(long)]
        json: bool,
    },
    /// The tuple profiles a run wrote (`values.pb.gz`, or with --targets
    /// `targets.pb.gz`; Sastry, Bodík & Smith's value and call-target
    /// profiles): per site, hottest first, its function and line, its
    /// executions, its invariance (the share of its most frequent value)
    /// and its most frequent values; with the exact copies of an
    /// evaluation, the profile's error against them.
    Values {
        /// A run's output directory, or one values.pb.gz or targets.pb.gz.
        #[arg(value_name = "OUT")]
        profile: PathBuf,
        /// The call-target profile (targets.pb.gz) rather than the value
        /// profile.
        #[arg(long)]
        targets: bool,
        /// How many of the hottest sites to list.
        #[arg(long, value_name = "N", default_value_t = 20)]
        top: usize,
        /// How many values to list per site.
        #[arg(long, value_name = "N", default_value_t = 4)]
        values: usize,
        /// The error looks at sites executed at least this often in the
        /// exact copies.
        #[arg(long, value_name = "N", default_value_t = 1000)]
        min_exec: u64,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Internal: a module's first analysis and generation, run by the
    /// daemon in a process of its own (its bytes on standard input).
    #[command(hide = true)]
    PrepareModule(crate::bursts::worker::WorkerArgs),
    /// Internal: addresses looked up in a module's DWARF, run by the
    /// daemon in a process of its own (addresses on standard input).
    #[command(hide = true)]
    SymbolizeDwarf(crate::stacks::dwarf_worker::DwarfWorkerArgs),
}

/// The configuration file and the HTTP endpoint: flags of the profiling
/// modes only (sampling every process or `--pid`, the service, `run`), not
/// of `analyze` or `hot-paths`, which neither read the file nor serve.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct ServiceArgs {
    /// Configuration file [default: /etc/burstyd/burstyd.toml if it
    /// exists; `run` reads one only when given]. Flags override its values;
    /// SIGHUP re-reads it.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    /// Ignore the configuration file.
    #[arg(long, conflicts_with = "config")]
    pub(crate) no_config: bool,

    /// Serve /debug/pprof/*, /metrics and /healthz on this address
    /// (HOST:PORT, a port on 127.0.0.1, or the absolute path of a Unix
    /// socket, mode 0660). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub(crate) http: Option<String>,
}

impl Cli {
    /// `--config`, `--no-config` and `--http` of the mode that runs: `run`'s,
    /// else the top level's.
    pub(crate) fn service(&self) -> &ServiceArgs {
        match &self.command {
            Some(Command::Run { service, .. }) => service,
            _ => &self.service,
        }
    }
}

#[derive(Debug, Args, Clone)]
pub(crate) struct ProfileArgs {
    /// Event whose overflow triggers a sample.
    #[arg(short, long, default_value = "cycles", value_name = "EVENT")]
    pub(crate) event: String,

    /// Take a sample every N events (e.g. every 1000000 cycles).
    #[arg(long, value_name = "N", conflicts_with = "freq")]
    pub(crate) period: Option<u64>,

    /// Take about HZ samples per second per CPU [default: 199, chosen from
    /// bench/overhead.sh].
    #[arg(short = 'F', long, value_name = "HZ")]
    pub(crate) freq: Option<u64>,

    /// Stop after this many seconds (default: until SIGINT/SIGTERM, or
    /// until the targets exit).
    #[arg(short, long, value_name = "SECS")]
    pub(crate) duration: Option<f64>,

    /// Write a fresh profile every SECS seconds (context-<time>.pb.gz),
    /// besides the final context.pb.gz.
    #[arg(short, long, value_name = "SECS")]
    pub(crate) interval: Option<f64>,

    /// Output directory.
    #[arg(short, long, default_value = "burstyd-out", value_name = "DIR")]
    pub(crate) output: PathBuf,

    /// Do not record kernel stacks.
    #[arg(long)]
    pub(crate) no_kernel: bool,

    /// Bursty tracing (--pid, run, or the configuration's targets; beats
    /// the file's [bursts] burst): checks per burst, i.e. how long
    /// each burst traces after a counter overflow switches a thread into
    /// the instrumented clones. 0 injects the clones and handles every
    /// overflow signal by returning straight to the original code: the
    /// cost of being attached, without bursts.
    #[arg(long, value_name = "CHECKS", default_value_t = crate::bursts::options::DEFAULT_BURST)]
    pub(crate) burst: u64,

    /// Bursts that may run at once in one process, each on its own
    /// thread (1 to 8; beats the file's [bursts] max_bursts) [default: 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=8))]
    pub(crate) max_bursts: Option<u64>,

    /// How each burst's counts are weighted into the estimated executions
    /// (beats the file's [bursts] weights) [default: uniform]. Bursts
    /// start at time-uniform points and last a fixed number of checks, so
    /// code dense in checks is under-counted against code sparse in them;
    /// `static` undoes that by the paths' static cost (right for
    /// compute-bound code, wrong where memory stalls dominate: the model
    /// sees no cache miss); `uniform` counts every burst alike. See
    /// ARCHITECTURE.md, "Estimates from bursts".
    #[arg(long, value_enum, value_name = "HOW", conflicts_with = "no_bursts")]
    pub(crate) weights: Option<crate::bursts::estimate::Weighting>,

    /// What bursts record besides paths, calls and returns (beats the
    /// file's [bursts] record): `refs`, every load and store of heap and
    /// global data with its address, from which the hot data streams are
    /// found (hot-streams.json; `burstyd hot-streams OUT`); `values`,
    /// every load of an integer register from heap or global data with
    /// the value loaded (values.pb.gz; `burstyd values OUT`); `targets`,
    /// every indirect call with its target (targets.pb.gz, and BOLT's
    /// call records in the edges fdata). Clones with them are bigger and
    /// bursts in them slower; without them the clones have no trace of
    /// them.
    #[arg(
        long,
        value_enum,
        value_name = "WHAT",
        value_delimiter = ',',
        conflicts_with = "no_bursts"
    )]
    pub(crate) record: Vec<crate::bursts::options::Record>,

    /// With --record refs, the stack's references too (by default an
    /// operand based on rsp, or on rbp where the function sets up a frame
    /// pointer, is left out).
    #[arg(long, requires = "record")]
    pub(crate) refs_stack: bool,

    /// With --record refs, the data references one burst records (beats
    /// the file's [bursts] refs_burst) [default: 32768]. Bursts that
    /// record references are this long (and at most 100 times --burst
    /// checks) and as rare as the daemon's analysis rate needs: long
    /// bursts find the streams of the whole trace, many short ones find
    /// their fragments.
    #[arg(long, value_name = "N", requires = "record", value_parser = clap::value_parser!(u64).range(1..=(1 << 16)))]
    pub(crate) refs_burst: Option<u64>,

    /// With --record values or targets, how the target compresses the
    /// tuples before they reach the daemon (Sastry, Bodík & Smith):
    /// `exact` (every tuple), `random` (each kept with probability 1 in
    /// --sample-rate), `stratified` (hashed into --strata substreams,
    /// every --sample-rate-th of each kept) [default: stratified, the
    /// lowest error for its outputs in bench/tuples.sh]. Identical
    /// outputs are merged in a 16-entry table before the ring.
    #[arg(long, value_enum, value_name = "HOW", requires = "record")]
    pub(crate) sampler: Option<crate::bursts::options::Sampler>,

    /// With --sampler random or stratified: one tuple kept in R
    /// [default: 16].
    #[arg(long, value_name = "R", requires = "sampler", value_parser = clap::value_parser!(u64).range(1..=65535))]
    pub(crate) sample_rate: Option<u64>,

    /// With --sampler stratified: the substreams (a power of two up to
    /// 4096) [default: 2048].
    #[arg(long, value_name = "N", requires = "sampler", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) strata: Option<u64>,

    /// With --sampler random or stratified: every tuple also written
    /// once exactly, flagged, beside the sampled outputs (an evaluation:
    /// `burstyd values OUT` then gives the sampler's error against the
    /// exact profile of the same run; costs what --sampler exact costs).
    #[arg(long, requires = "sampler")]
    pub(crate) sampler_reference: bool,

    /// Sample only: no rewriting, no bursts (--pid, run, or the
    /// configuration's targets).
    #[arg(long, conflicts_with_all = ["full_trace", "save_bursts"])]
    pub(crate) no_bursts: bool,

    /// Trace every event from the first burst on (ground truth; slow;
    /// --pid or run only).
    #[arg(long)]
    pub(crate) full_trace: bool,

    /// Bursts rewrite only the executable, not the shared libraries it
    /// has mapped (libc, libstdc++, ...): a burst then pauses whenever
    /// the program calls into a library.
    #[arg(long, conflicts_with = "no_bursts")]
    pub(crate) exe_only: bool,

    /// Also write the raw burst traces to <OUTPUT>/bursts.jsonl.
    #[arg(long)]
    pub(crate) save_bursts: bool,

    /// Measure each path's time in bursts: the time-stamp counter read
    /// at every path's start and end, exclusive of its callees
    /// (paths.pb.gz's measured-time/nanoseconds, then its default type).
    /// Costs about 10-50 µs more per burst.
    #[arg(long, conflicts_with = "no_bursts")]
    pub(crate) path_time: bool,

    /// The plan cache: what bursty tracing analysed and generated for
    /// each module, kept by the file's content, so that the next attach to
    /// the same file (a re-attach, another process of the program, another
    /// program using the same library) costs no analysis and no generation
    /// [default: /var/cache/burstyd as root, else ~/.cache/burstyd].
    #[arg(long, value_name = "DIR", env = "BURSTYD_CACHE_DIR")]
    pub(crate) cache_dir: Option<PathBuf>,

    /// Neither read nor write the plan cache.
    #[arg(long)]
    pub(crate) no_cache: bool,

    /// Bound on the plan cache's size: the least recently used entries
    /// go beyond it.
    #[arg(long, value_name = "MB", default_value_t = crate::bursts::cache::DEFAULT_MAX_MB)]
    pub(crate) cache_max_mb: u64,

    /// More logging (-v debug, -vv trace).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
}

#[cfg(test)]
mod tests {
    use super::{Cli, Command};
    use clap::Parser;
    use clap::error::ErrorKind;

    const SERVICE_FLAGS: [&str; 3] = ["--config", "--no-config", "--http"];

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("burstyd").chain(args.iter().copied()))
    }

    /// The help text `burstyd ARGS --help` prints.
    fn help(args: &[&str]) -> String {
        let mut a = args.to_vec();
        a.push("--help");
        let e = parse(&a).expect_err("--help ends parsing");
        assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{e}");
        e.to_string()
    }

    #[test]
    fn analyze_and_hot_paths_neither_offer_nor_take_config_or_http() {
        for sub in [
            &["analyze", "/bin/true"][..],
            &["hot-paths", "paths.pb.gz"],
            &["values", "out"],
        ] {
            let text = help(&sub[..1]);
            for flag in SERVICE_FLAGS {
                assert!(
                    !text.contains(flag),
                    "`{} --help` lists {flag}:\n{text}",
                    sub[0]
                );
            }
            for extra in [
                &["--http", "127.0.0.1:6060"][..],
                &["--config", "b.toml"],
                &["--no-config"],
            ] {
                let mut after = sub.to_vec();
                after.extend_from_slice(extra);
                let e = parse(&after).expect_err(&format!("{after:?} accepted"));
                assert_eq!(e.kind(), ErrorKind::UnknownArgument, "{after:?}: {e}");
                // Nor before the subcommand, where the top level would
                // take them and drop them.
                let mut before = extra.to_vec();
                before.extend_from_slice(sub);
                let e = parse(&before).expect_err(&format!("{before:?} accepted"));
                assert_eq!(e.kind(), ErrorKind::ArgumentConflict, "{before:?}: {e}");
            }
        }
    }

    #[test]
    fn the_profiling_modes_offer_and_take_config_and_http() {
        for args in [&[][..], &["run", "--", "true"]] {
            let text = help(&args[..args.len().min(1)]);
            for flag in SERVICE_FLAGS {
                assert!(text.contains(flag), "{args:?} --help lacks {flag}:\n{text}");
            }
        }
        // Sampling every process, --pid, the service (top level).
        let cli = parse(&[
            "--pid",
            "7",
            "--http",
            "127.0.0.1:6060",
            "--config",
            "b.toml",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.service().http.as_deref(), Some("127.0.0.1:6060"));
        assert_eq!(cli.service().config.as_deref(), Some("b.toml".as_ref()));
        assert!(parse(&["--no-config"]).unwrap().service().no_config);
        // `run`: its own.
        let cli = parse(&["run", "--http", "6060", "--config", "r.toml", "--", "true"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Run { .. })));
        assert_eq!(cli.service().http.as_deref(), Some("6060"));
        assert_eq!(cli.service().config.as_deref(), Some("r.toml".as_ref()));
        assert!(cli.service.http.is_none());
        let cli = parse(&["run", "--no-config", "--", "true"]).unwrap();
        assert!(cli.service().no_config);
        assert_eq!(
            parse(&["run", "--no-config", "--config", "r.toml", "--", "true"])
                .unwrap_err()
                .kind(),
            ErrorKind::ArgumentConflict
        );
    }
}
