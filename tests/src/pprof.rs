//! Direct decoding of burstyd's output (gzip'd pprof `profile.proto`), with a
//! minimal prost message set written by hand from profile.proto's field
//! numbers, and a resolved view (frames leaf first, labels by key).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};
use prost::Message;

/// Messages of github.com/google/pprof/proto/profile.proto (the fields we use;
/// prost skips unknown ones).
pub mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// One frame of a resolved stack (one `Line` of a `Location`; a location with
/// no lines gives one frame with `function == None`).
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// Function name (demangled by burstyd), None if unsymbolized.
    pub function: Option<String>,
    /// Source file of the function, if any.
    pub source_file: Option<String>,
    pub line: i64,
    /// Filename of the location's mapping ("" if none).
    pub mapping_file: String,
    /// Build id of the location's mapping ("" if none).
    pub build_id: String,
    pub address: u64,
    /// True for all but the last (outermost) line of a location: this frame
    /// was inlined into the next one.
    pub inlined: bool,
}

impl Frame {
    /// The function name, or `0x<address>` for an unsymbolized frame.
    pub fn name(&self) -> String {
        match &self.function {
            Some(f) => f.clone(),
            None => format!("0x{:x}", self.address),
        }
    }
}

/// One sample with its stack resolved, leaf first.
#[derive(Clone, Debug)]
pub struct Sample {
    pub frames: Vec<Frame>,
    pub values: Vec<i64>,
    /// String labels (first value per key).
    pub labels: BTreeMap<String, String>,
    /// Numeric labels (first value per key).
    pub num_labels: BTreeMap<String, i64>,
}

impl Sample {
    /// Frame names leaf first (inline frames included).
    pub fn names(&self) -> Vec<String> {
        self.frames.iter().map(Frame::name).collect()
    }
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
    pub fn pid(&self) -> Option<u32> {
        self.label("pid").and_then(|p| p.parse().ok())
    }
    pub fn has_function(&self, name: &str) -> bool {
        self.frames
            .iter()
            .any(|f| f.function.as_deref() == Some(name))
    }
}

/// A decoded profile: the raw message plus resolved samples.
#[derive(Clone, Debug)]
pub struct Profile {
    pub raw: pb::Profile,
    /// (type, unit) per sample value, e.g. ("samples","count"), ("cpu-clock","nanoseconds").
    pub sample_types: Vec<(String, String)>,
    pub samples: Vec<Sample>,
}

impl Profile {
    pub fn string(&self, idx: i64) -> String {
        self.raw
            .string_table
            .get(idx as usize)
            .cloned()
            .unwrap_or_default()
    }
    /// Index of the sample value of the given type name.
    pub fn value_index(&self, ty: &str) -> Option<usize> {
        self.sample_types.iter().position(|(t, _)| t == ty)
    }
    /// Sum of the `samples` values (number of samples), or the sample count if
    /// there is no such type.
    pub fn total_samples(&self) -> i64 {
        match self.value_index("samples") {
            Some(i) => self
                .samples
                .iter()
                .map(|s| s.values.get(i).copied().unwrap_or(0))
                .sum(),
            None => self.samples.len() as i64,
        }
    }
    /// `samples` value of one sample (1 if the profile lacks that type).
    pub fn weight(&self, s: &Sample) -> i64 {
        match self.value_index("samples") {
            Some(i) => s.values.get(i).copied().unwrap_or(0),
            None => 1,
        }
    }
    pub fn mapping_files(&self) -> Vec<String> {
        self.raw
            .mapping
            .iter()
            .map(|m| self.string(m.filename))
            .collect()
    }
}

/// Gunzips (if gzip'd) and decodes a pprof file.
pub fn read_profile(path: &Path) -> Result<Profile> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    decode_profile(&bytes).with_context(|| format!("decoding {}", path.display()))
}

pub fn decode_profile(bytes: &[u8]) -> Result<Profile> {
    let raw_bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .context("gunzip")?;
        out
    } else {
        bytes.to_vec()
    };
    let raw = pb::Profile::decode(raw_bytes.as_slice()).context("protobuf decode")?;
    resolve(raw)
}

/// Checks referential integrity and builds the resolved view.
pub fn resolve(raw: pb::Profile) -> Result<Profile> {
    let st = &raw.string_table;
    if st.first().map(String::as_str) != Some("") {
        bail!("string_table[0] must be \"\" (got {:?})", st.first());
    }
    let s = |i: i64| -> Result<String> {
        st.get(usize::try_from(i).map_err(|_| anyhow::anyhow!("negative string index {i}"))?)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("string index {i} out of range ({} strings)", st.len()))
    };
    let sample_types = raw
        .sample_type
        .iter()
        .map(|vt| Ok((s(vt.r#type)?, s(vt.unit)?)))
        .collect::<Result<Vec<_>>>()?;

    let mut mappings = BTreeMap::new();
    for m in &raw.mapping {
        if m.id == 0
            || mappings
                .insert(m.id, (s(m.filename)?, s(m.build_id)?))
                .is_some()
        {
            bail!("mapping id {} is zero or duplicated", m.id);
        }
    }
    let mut functions = BTreeMap::new();
    for f in &raw.function {
        if f.id == 0
            || functions
                .insert(f.id, (s(f.name)?, s(f.filename)?))
                .is_some()
        {
            bail!("function id {} is zero or duplicated", f.id);
        }
        s(f.system_name)?;
    }
    let mut locations: BTreeMap<u64, Vec<Frame>> = BTreeMap::new();
    for l in &raw.location {
        if l.id == 0 {
            bail!("location id 0");
        }
        let (mapping_file, build_id) = if l.mapping_id == 0 {
            (String::new(), String::new())
        } else {
            mappings.get(&l.mapping_id).cloned().ok_or_else(|| {
                anyhow::anyhow!("location {} has unknown mapping {}", l.id, l.mapping_id)
            })?
        };
        let mut frames = Vec::new();
        for (i, line) in l.line.iter().enumerate() {
            let (name, file) = functions.get(&line.function_id).cloned().ok_or_else(|| {
                anyhow::anyhow!(
                    "location {} has unknown function {}",
                    l.id,
                    line.function_id
                )
            })?;
            frames.push(Frame {
                function: (!name.is_empty()).then_some(name),
                source_file: (!file.is_empty()).then_some(file),
                line: line.line,
                mapping_file: mapping_file.clone(),
                build_id: build_id.clone(),
                address: l.address,
                inlined: i + 1 != l.line.len(),
            });
        }
        if frames.is_empty() {
            frames.push(Frame {
                function: None,
                source_file: None,
                line: 0,
                mapping_file,
                build_id,
                address: l.address,
                inlined: false,
            });
        }
        if locations.insert(l.id, frames).is_some() {
            bail!("duplicated location id {}", l.id);
        }
    }
    let mut samples = Vec::with_capacity(raw.sample.len());
    for (n, smp) in raw.sample.iter().enumerate() {
        if smp.value.len() != sample_types.len() {
            bail!(
                "sample {n} has {} values but there are {} sample types",
                smp.value.len(),
                sample_types.len()
            );
        }
        let mut frames = Vec::new();
        for id in &smp.location_id {
            frames.extend(
                locations
                    .get(id)
                    .ok_or_else(|| anyhow::anyhow!("sample {n} references unknown location {id}"))?
                    .iter()
                    .cloned(),
            );
        }
        let mut labels = BTreeMap::new();
        let mut num_labels = BTreeMap::new();
        for lb in &smp.label {
            let key = s(lb.key)?;
            if lb.str != 0 {
                labels.entry(key).or_insert(s(lb.str)?);
            } else {
                num_labels.entry(key).or_insert(lb.num);
            }
        }
        samples.push(Sample {
            frames,
            values: smp.value.clone(),
            labels,
            num_labels,
        });
    }
    Ok(Profile {
        raw,
        sample_types,
        samples,
    })
}

/// (stack leaf first, count, labels) of one synthetic sample.
pub type SyntheticSample<'a> = (Vec<&'a str>, i64, Vec<(&'a str, &'a str)>);

/// Builds a small synthetic profile (used to self-test the readers without
/// the daemon). Stacks are given leaf first as function names; a label named
/// `tid` becomes numeric.
pub fn synthetic_profile(samples: &[SyntheticSample]) -> pb::Profile {
    let mut strings: Vec<String> = vec![String::new()];
    let mut intern = |s: &str| -> i64 {
        if let Some(i) = strings.iter().position(|x| x == s) {
            return i as i64;
        }
        strings.push(s.to_string());
        (strings.len() - 1) as i64
    };
    let mut p = pb::Profile {
        sample_type: vec![
            pb::ValueType {
                r#type: intern("samples"),
                unit: intern("count"),
            },
            pb::ValueType {
                r#type: intern("cpu-clock"),
                unit: intern("nanoseconds"),
            },
        ],
        period_type: Some(pb::ValueType {
            r#type: intern("cpu-clock"),
            unit: intern("nanoseconds"),
        }),
        period: 1_000_000,
        mapping: vec![pb::Mapping {
            id: 1,
            memory_start: 0x1000,
            memory_limit: 0x100000,
            filename: intern("/bin/synthetic"),
            build_id: intern("0123456789abcdef"),
            has_functions: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut func_ids: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, count, labels) in samples {
        let mut loc_ids = Vec::new();
        for name in stack {
            let fid = match func_ids.get(*name) {
                Some(id) => *id,
                None => {
                    let id = func_ids.len() as u64 + 1;
                    func_ids.insert(name.to_string(), id);
                    let n = intern(name);
                    p.function.push(pb::Function {
                        id,
                        name: n,
                        system_name: n,
                        ..Default::default()
                    });
                    id
                }
            };
            let lid = p.location.len() as u64 + 1;
            p.location.push(pb::Location {
                id: lid,
                mapping_id: 1,
                address: 0x1000 + 0x10 * lid,
                line: vec![pb::Line {
                    function_id: fid,
                    line: 0,
                }],
                is_folded: false,
            });
            loc_ids.push(lid);
        }
        let mut label = Vec::new();
        for (k, v) in labels {
            if *k == "tid" {
                label.push(pb::Label {
                    key: intern(k),
                    num: v.parse().unwrap(),
                    ..Default::default()
                });
            } else {
                label.push(pb::Label {
                    key: intern(k),
                    str: intern(v),
                    ..Default::default()
                });
            }
        }
        p.sample.push(pb::Sample {
            location_id: loc_ids,
            value: vec![*count, count * 1_000_000],
            label,
        });
    }
    p.string_table = strings;
    p
}

/// Writes a profile gzip'd.
pub fn write_profile_gz(p: &pb::Profile, path: &Path) -> Result<()> {
    use std::io::Write;
    let f = std::fs::File::create(path)?;
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    gz.write_all(&p.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}
