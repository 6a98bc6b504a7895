//! Runs the reference reader, `go tool pprof`, on a profile and parses its
//! `-traces` and `-top` text output.
//!
//! pprof is run with `-symbolize=none`: burstyd's profiles are already
//! symbolized, and we test *its* symbols and demangling, not pprof's local
//! re-symbolization (which would also print "Local symbolization failed"
//! style warnings). Any output on pprof's stderr fails the call.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// One sample of `-traces` output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceSample {
    /// The sample value as pprof prints it (e.g. "1", "10ms").
    pub value: String,
    /// Frame names, leaf first, with the " (inline)" suffix removed.
    pub frames: Vec<String>,
    /// Parallel to `frames`: pprof marked the frame "(inline)".
    pub inline: Vec<bool>,
    /// String and numeric labels (numeric ones as printed), by key.
    pub labels: BTreeMap<String, String>,
}

impl TraceSample {
    /// Parsed numeric value (plain integer values only, which is what
    /// count-typed samples print as; 0 otherwise).
    pub fn count(&self) -> i64 {
        self.value.parse().unwrap_or(0)
    }
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
    pub fn has(&self, func: &str) -> bool {
        self.frames.iter().any(|f| f == func)
    }
    /// True if `chain` (leaf first) appears as contiguous frames.
    pub fn has_chain(&self, chain: &[&str]) -> bool {
        !chain.is_empty()
            && self
                .frames
                .windows(chain.len())
                .any(|w| w.iter().zip(chain).all(|(a, b)| a == b))
    }
}

/// One row of `-top` output.
#[derive(Clone, Debug, PartialEq)]
pub struct TopRow {
    pub flat: String,
    pub flat_pct: f64,
    pub sum_pct: f64,
    pub cum: String,
    pub cum_pct: f64,
    /// Function name, with pprof's " (inline)" suffix removed.
    pub name: String,
    /// pprof printed " (inline)": the node is a function inlined into its caller.
    pub inline: bool,
}

/// Output of a `go tool pprof` run.
#[derive(Clone, Debug)]
pub struct PprofOutput {
    pub stdout: String,
    pub header: Vec<String>,
}

fn go_binary() -> String {
    std::env::var("GO").unwrap_or_else(|_| "go".to_string())
}

/// Runs `go tool pprof -symbolize=none <args> <profile>`; fails if pprof
/// exits non-zero or prints anything on stderr.
pub fn run_pprof(profile: &Path, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new(go_binary());
    cmd.arg("tool")
        .arg("pprof")
        .arg("-symbolize=none")
        .args(args)
        .arg(profile);
    // Keep pprof from looking for binaries in $HOME/pprof/binaries or writing
    // anything under $HOME.
    let scratch = std::env::temp_dir().join(format!("burstyd-tests-pprof-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    cmd.env("PPROF_TMPDIR", &scratch);
    let out = cmd.output().with_context(|| {
        "running `go tool pprof` (install Go: apt-get install -y golang-go)".to_string()
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        bail!(
            "go tool pprof {args:?} {} failed ({}):\nstderr:\n{stderr}\nstdout (head):\n{}",
            profile.display(),
            out.status,
            head(&stdout, 40)
        );
    }
    if !stderr.trim().is_empty() {
        bail!(
            "go tool pprof {args:?} {} printed on stderr (warnings are failures):\n{stderr}",
            profile.display()
        );
    }
    Ok(stdout)
}

pub fn head(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join("\n")
}

const SEPARATOR: &str = "-----------+-------------------------------------------------------";

/// `go tool pprof -traces` parsed. `sample_index` selects the value printed
/// (e.g. "samples"); None keeps pprof's default.
pub fn traces(
    profile: &Path,
    sample_index: Option<&str>,
) -> Result<(Vec<String>, Vec<TraceSample>)> {
    let mut args = vec!["-traces".to_string()];
    if let Some(si) = sample_index {
        args.push(format!("-sample_index={si}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_pprof(profile, &args)?;
    parse_traces(&out)
}

/// Parses `-traces` text (see pprof's internal/report printTraces): a header,
/// then per sample a separator line, label lines `%10s:  %s`, and frame lines
/// `%10s   %s` (value on the first frame only, " (inline)" suffix on frames
/// inlined into the next one).
pub fn parse_traces(text: &str) -> Result<(Vec<String>, Vec<TraceSample>)> {
    let mut header = Vec::new();
    let mut samples: Vec<TraceSample> = Vec::new();
    let mut cur: Option<TraceSample> = None;
    let mut seen_sep = false;
    for (n, line) in text.lines().enumerate() {
        if line == SEPARATOR {
            seen_sep = true;
            if let Some(s) = cur.take() {
                if s.frames.is_empty() {
                    bail!("line {}: sample without frames", n + 1);
                }
                samples.push(s);
            }
            cur = Some(TraceSample::default());
            continue;
        }
        if !seen_sep {
            header.push(line.to_string());
            continue;
        }
        let s = cur.as_mut().expect("separator seen");
        if line.trim().is_empty() {
            continue;
        }
        if s.frames.is_empty() {
            // Label line: "%10s:  %s" (keys are not padded past 10 chars).
            let t = line.trim_start();
            if let Some(idx) = t.find(":  ") {
                let key = &t[..idx];
                if !key.is_empty() && !key.contains(char::is_whitespace) {
                    s.labels.insert(key.to_string(), t[idx + 3..].to_string());
                    continue;
                }
            }
        }
        // Frame line: 10-char right-aligned value column, 3 spaces, name.
        if line.len() < 14 || !line.is_char_boundary(10) {
            bail!("line {}: unexpected -traces line {line:?}", n + 1);
        }
        let (col, rest) = (&line[..10], &line[10..]);
        if !rest.starts_with("   ") {
            bail!("line {}: unexpected -traces line {line:?}", n + 1);
        }
        let mut name = rest[3..].to_string();
        let inline = name.ends_with(" (inline)");
        if inline {
            name.truncate(name.len() - " (inline)".len());
        }
        if s.frames.is_empty() {
            s.value = col.trim().to_string();
        } else if !col.trim().is_empty() {
            bail!("line {}: value on a non-leaf frame: {line:?}", n + 1);
        }
        s.frames.push(name);
        s.inline.push(inline);
    }
    if let Some(s) = cur
        && (!s.frames.is_empty() || !s.labels.is_empty())
    {
        bail!("-traces output does not end with a separator");
    }
    if !seen_sep {
        bail!("no samples in -traces output:\n{}", head(text, 20));
    }
    Ok((header, samples))
}

/// `go tool pprof -top` parsed (all nodes: -nodecount=0 is not supported
/// everywhere, so a large count is passed).
pub fn top(profile: &Path, sample_index: Option<&str>) -> Result<(Vec<String>, Vec<TopRow>)> {
    let mut args = vec![
        "-top".to_string(),
        "-nodecount=1000000".to_string(),
        "-nodefraction=0".to_string(),
    ];
    if let Some(si) = sample_index {
        args.push(format!("-sample_index={si}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_pprof(profile, &args)?;
    parse_top(&out)
}

/// Parses `-top` text: header lines, the column header
/// `flat  flat%   sum%        cum   cum%`, then rows
/// `<flat> <flat%> <sum%> <cum> <cum%> <name...>`.
pub fn parse_top(text: &str) -> Result<(Vec<String>, Vec<TopRow>)> {
    let mut header = Vec::new();
    let mut rows = Vec::new();
    let mut in_rows = false;
    for (n, line) in text.lines().enumerate() {
        if !in_rows {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols == ["flat", "flat%", "sum%", "cum", "cum%"] {
                in_rows = true;
            } else {
                header.push(line.to_string());
            }
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let mut field = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("line {}: short -top row {line:?}", n + 1))
        };
        let flat = field()?.to_string();
        let flat_pct = pct(field()?)?;
        let sum_pct = pct(field()?)?;
        let cum = field()?.to_string();
        let cum_pct = pct(field()?)?;
        // The name is the rest of the line after the 5th field.
        let mut rest = line.trim_start();
        for _ in 0..5 {
            rest = rest.trim_start();
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            rest = &rest[end..];
        }
        let mut name = rest.trim().to_string();
        let inline = name.ends_with(" (inline)");
        if inline {
            name.truncate(name.len() - " (inline)".len());
        }
        if name.is_empty() {
            bail!("line {}: -top row without a name: {line:?}", n + 1);
        }
        rows.push(TopRow {
            flat,
            flat_pct,
            sum_pct,
            cum,
            cum_pct,
            name,
            inline,
        });
    }
    if !in_rows {
        bail!("no column header in -top output:\n{}", head(text, 20));
    }
    Ok((header, rows))
}

fn pct(s: &str) -> Result<f64> {
    s.strip_suffix('%')
        .ok_or_else(|| anyhow::anyhow!("not a percentage: {s:?}"))?
        .parse::<f64>()
        .with_context(|| format!("not a percentage: {s:?}"))
}
