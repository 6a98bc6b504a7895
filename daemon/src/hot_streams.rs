//! `burstyd hot-streams`: the hot data streams of a data reference trace
//! (see [`crate::streams`]), as a readable report or as JSON:
//! `{"references": N, "streams": [{"signature": [{"module", "build_id",
//! "address", "function", "line"}], "heat", "frequency", "length",
//! "pattern", "strides", "example"}]}` (README, "Hot data streams").
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::streams::hot::{HotOptions, Pattern, Stream, hot_streams, pattern};
use crate::streams::references::References;

pub(crate) struct HotStreamOptions {
    pub(crate) hot: HotOptions,
    pub(crate) top: usize,
    pub(crate) json: bool,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Report {
    /// References in the trace.
    pub(crate) references: u64,
    /// Memory mode: references recorded but not analysed (bursts beyond
    /// the analysis rate, or the process's bound on references held).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) dropped: u64,
    /// The share of them the hot streams account for.
    pub(crate) hot_share: f64,
    pub(crate) min_length: u64,
    pub(crate) max_length: u64,
    pub(crate) streams: Vec<StreamOut>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize)]
pub(crate) struct StreamOut {
    pub(crate) signature: Vec<RefSite>,
    /// Its share of all references.
    pub(crate) heat: f64,
    pub(crate) frequency: u64,
    pub(crate) length: usize,
    /// `constant`, `stride` or `irregular`.
    pub(crate) pattern: String,
    /// With `stride`: each instruction's step, in signature order of
    /// their first repeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) strides: Vec<i64>,
    /// The data addresses of one occurrence (hex).
    pub(crate) example: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct RefSite {
    pub(crate) module: String,
    pub(crate) build_id: Option<String>,
    /// Static virtual address (hex), as `nm` prints it.
    pub(crate) address: String,
    pub(crate) function: Option<String>,
    /// `file:line` where the module has line info.
    pub(crate) line: Option<String>,
}

/// `burstyd hot-streams --from-trace FILE`.
pub(crate) fn run(trace: &Path, opts: &HotStreamOptions) -> anyhow::Result<()> {
    let file =
        std::fs::File::open(trace).with_context(|| format!("opening {}", trace.display()))?;
    let refs =
        crate::streams::trace::read(std::io::BufReader::new(file), &trace.display().to_string())?;
    let report = report(&refs, &opts.hot);
    print(&report, opts)
}

/// `burstyd hot-streams OUT`: the streams a run with `--record refs`
/// found (`OUT/hot-streams.json`, or the JSON file given).
pub(crate) fn show(out: &Path, opts: &HotStreamOptions) -> anyhow::Result<()> {
    let file = if out.is_dir() {
        let f = out.join("hot-streams.json");
        if !f.exists() {
            anyhow::bail!(
                "{} has no hot-streams.json: profile with --record refs to find hot data streams",
                out.display()
            );
        }
        f
    } else {
        out.to_path_buf()
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let report: Report = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a hot data streams report", file.display()))?;
    print(&report, opts)
}

fn print(report: &Report, opts: &HotStreamOptions) -> anyhow::Result<()> {
    let text = if opts.json {
        serde_json::to_string_pretty(report)? + "\n"
    } else {
        let mut text = Vec::new();
        print_report(&mut text, report, opts.top)?;
        String::from_utf8(text)?
    };
    crate::sys::print_stdout(&text)
}

/// The hot streams of `refs`, with their instructions named.
pub(crate) fn report(refs: &References, hot: &HotOptions) -> Report {
    let streams = hot_streams(refs, hot);
    let sites = name_sites(refs, &streams);
    let total = refs.count.max(1) as f64;
    let out: Vec<StreamOut> = streams
        .iter()
        .map(|s| {
            let (pattern, strides) = match pattern(s) {
                Pattern::Constant => ("constant".to_string(), Vec::new()),
                Pattern::Stride(v) => ("stride".to_string(), v),
                Pattern::Irregular => ("irregular".to_string(), Vec::new()),
            };
            StreamOut {
                signature: s.signature.iter().map(|i| sites[i].clone()).collect(),
                heat: s.heat as f64 / total,
                frequency: s.frequency,
                length: s.length(),
                pattern,
                strides,
                example: s.example.iter().map(|a| format!("{a:#x}")).collect(),
            }
        })
        .collect();
    Report {
        references: refs.count,
        dropped: 0,
        hot_share: streams.iter().map(|s| s.heat).sum::<u64>() as f64 / total,
        min_length: hot.min_len,
        max_length: hot.max_len,
        streams: out,
    }
}

/// Each instruction of the streams with its module's build ID, its
/// function and its source line, where the module file says.
fn name_sites(refs: &References, streams: &[Stream]) -> HashMap<u32, RefSite> {
    let mut by_module: HashMap<u32, Vec<u32>> = HashMap::new();
    for s in streams {
        for &i in &s.signature {
            let m = refs.instrs[i as usize].module;
            let v = by_module.entry(m).or_default();
            if !v.contains(&i) {
                v.push(i);
            }
        }
    }
    let mut out = HashMap::new();
    for (m, instrs) in by_module {
        let path = &refs.modules[m as usize];
        let module = std::fs::File::open(path)
            .ok()
            .and_then(|f| crate::stacks::modules::Module::from_file(path, path.into(), f).ok())
            .map(std::sync::Arc::new);
        let build_id = module
            .as_ref()
            .and_then(|m| m.build_id().map(str::to_owned));
        let addrs: Vec<u64> = instrs
            .iter()
            .map(|&i| refs.instrs[i as usize].vaddr)
            .collect();
        let frames = module
            .map(|m| crate::stacks::symbolize::resolve_in_module(m, &addrs))
            .unwrap_or_default();
        for (&i, a) in instrs.iter().zip(&addrs) {
            // The innermost frame: where the instruction is, inlined or not.
            let inner = frames.get(a).and_then(|f| f.first());
            let line = inner.and_then(|f| {
                let file = f.file.as_deref()?;
                Some(format!(
                    "{}:{}",
                    file.rsplit('/').next().unwrap_or(file),
                    f.line?
                ))
            });
            out.insert(
                i,
                RefSite {
                    module: path.clone(),
                    build_id: build_id.clone(),
                    address: format!("{a:#x}"),
                    function: inner.map(|f| f.function.clone()).filter(|f| f != "??"),
                    line,
                },
            );
        }
    }
    out
}

fn print_report(out: &mut impl Write, r: &Report, top: usize) -> std::io::Result<()> {
    writeln!(
        out,
        "hot data streams: {} references; {} streams of {} to {} references account for {:.1}% of them",
        r.references,
        r.streams.len(),
        r.min_length,
        r.max_length,
        100.0 * r.hot_share
    )?;
    for (k, s) in r.streams.iter().take(top).enumerate() {
        let how = match s.pattern.as_str() {
            "stride" => format!(
                "stride {}",
                s.strides
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            p => p.to_string(),
        };
        writeln!(
            out,
            "{:>4}. {:5.1}% of references, {} times, {} references, addresses {how}",
            k + 1,
            100.0 * s.heat,
            s.frequency,
            s.length
        )?;
        // The signature, runs of one site folded.
        let mut i = 0;
        while i < s.signature.len() {
            let site = &s.signature[i];
            let mut j = i + 1;
            while j < s.signature.len()
                && s.signature[j].address == site.address
                && s.signature[j].module == site.module
            {
                j += 1;
            }
            let module = site.module.rsplit('/').next().unwrap_or(&site.module);
            let at = match (&site.function, &site.line) {
                (Some(f), Some(l)) => format!(" {f} {l}"),
                (Some(f), None) => format!(" {f}"),
                (None, Some(l)) => format!(" {l}"),
                (None, None) => String::new(),
            };
            let times = if j - i > 1 {
                format!(" ×{}", j - i)
            } else {
                String::new()
            };
            writeln!(
                out,
                "        {module}+{}{at}{times}  e.g. {}",
                site.address, s.example[i]
            )?;
            i = j;
        }
    }
    Ok(())
}
