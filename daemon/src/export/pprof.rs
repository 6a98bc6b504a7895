//! profile.proto (pprof) messages and a builder that deduplicates strings,
//! functions, locations and mappings.
//!
//! The messages are written out with prost's derive (no protoc needed); the
//! field numbers are those of
//! <https://github.com/google/pprof/blob/main/proto/profile.proto>.
//! `go tool pprof` is the reference reader; the integration tests run it.
use std::collections::HashMap;
use std::io::Write;

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub(crate) sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub(crate) location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub(crate) function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub(crate) string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub(crate) drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub(crate) keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub(crate) time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub(crate) duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub(crate) period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub(crate) period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub(crate) comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub(crate) default_sample_type: i64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub(crate) struct ValueType {
    #[prost(int64, tag = "1")]
    pub(crate) r#type: i64,
    #[prost(int64, tag = "2")]
    pub(crate) unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub(crate) value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Label {
    #[prost(int64, tag = "1")]
    pub(crate) key: i64,
    #[prost(int64, tag = "2")]
    pub(crate) str: i64,
    #[prost(int64, tag = "3")]
    pub(crate) num: i64,
    #[prost(int64, tag = "4")]
    pub(crate) num_unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Mapping {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub(crate) file_offset: u64,
    #[prost(int64, tag = "5")]
    pub(crate) filename: i64,
    #[prost(int64, tag = "6")]
    pub(crate) build_id: i64,
    #[prost(bool, tag = "7")]
    pub(crate) has_functions: bool,
    #[prost(bool, tag = "8")]
    pub(crate) has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub(crate) has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub(crate) has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Location {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) address: u64,
    #[prost(message, repeated, tag = "4")]
    pub(crate) line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub(crate) is_folded: bool,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Line {
    #[prost(uint64, tag = "1")]
    pub(crate) function_id: u64,
    #[prost(int64, tag = "2")]
    pub(crate) line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Function {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(int64, tag = "2")]
    pub(crate) name: i64,
    #[prost(int64, tag = "3")]
    pub(crate) system_name: i64,
    #[prost(int64, tag = "4")]
    pub(crate) filename: i64,
    #[prost(int64, tag = "5")]
    pub(crate) start_line: i64,
}

/// A mapping as the builder's caller describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MappingKey {
    pub(crate) start: u64,
    pub(crate) limit: u64,
    pub(crate) file_offset: u64,
    pub(crate) filename: String,
    pub(crate) build_id: String,
}

/// One source-level frame of a location (innermost inlined first).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LineKey {
    pub(crate) function: String,
    pub(crate) file: String,
    pub(crate) line: i64,
}

/// Builds a [`Profile`], interning strings, functions, mappings and
/// locations so each appears once.
pub(crate) struct ProfileBuilder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    mappings: HashMap<MappingKey, u64>,
    locations: HashMap<(u64, u64, Vec<LineKey>), u64>,
}

impl ProfileBuilder {
    /// `sample_types` are (type, unit) pairs, e.g. `("samples", "count")`.
    pub(crate) fn new(
        sample_types: &[(&str, &str)],
        period_type: (&str, &str),
        period: i64,
    ) -> Self {
        let mut b = ProfileBuilder {
            profile: Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
        };
        b.string(""); // string_table[0] must be "".
        for (t, u) in sample_types {
            let vt = b.value_type(t, u);
            b.profile.sample_type.push(vt);
        }
        b.profile.period_type = Some(b.value_type(period_type.0, period_type.1));
        b.profile.period = period;
        b
    }

    fn value_type(&mut self, t: &str, u: &str) -> ValueType {
        ValueType {
            r#type: self.string(t),
            unit: self.string(u),
        }
    }

    pub(crate) fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    pub(crate) fn set_time(&mut self, time_nanos: i64, duration_nanos: i64) {
        self.profile.time_nanos = time_nanos;
        self.profile.duration_nanos = duration_nanos;
    }

    pub(crate) fn set_default_sample_type(&mut self, t: &str) {
        self.profile.default_sample_type = self.string(t);
    }

    pub(crate) fn add_comment(&mut self, c: &str) {
        let i = self.string(c);
        self.profile.comment.push(i);
    }

    pub(crate) fn mapping(&mut self, key: &MappingKey, symbolized: bool) -> u64 {
        if let Some(&id) = self.mappings.get(key) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(&key.filename);
        let build_id = self.string(&key.build_id);
        self.profile.mapping.push(Mapping {
            id,
            memory_start: key.start,
            memory_limit: key.limit,
            file_offset: key.file_offset,
            filename,
            build_id,
            has_functions: symbolized,
            has_filenames: symbolized,
            has_line_numbers: symbolized,
            has_inline_frames: symbolized,
        });
        self.mappings.insert(key.clone(), id);
        id
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        let key = (self.string(name), self.string(file));
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(Function {
            id,
            name: key.0,
            system_name: key.0,
            filename: key.1,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    /// A location at `address` in mapping `mapping_id` (0: none) whose
    /// frames are `lines`, innermost inlined frame first.
    pub(crate) fn location(&mut self, mapping_id: u64, address: u64, lines: &[LineKey]) -> u64 {
        let key = (mapping_id, address, lines.to_vec());
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let line = lines
            .iter()
            .map(|l| Line {
                function_id: self.function(&l.function, &l.file),
                line: l.line,
            })
            .collect();
        self.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line,
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    /// Adds a sample; `locations` leaf first. `labels` are string labels,
    /// `num_labels` numeric ones.
    pub(crate) fn sample(
        &mut self,
        locations: Vec<u64>,
        values: Vec<i64>,
        labels: &[(&str, &str)],
        num_labels: &[(&str, i64)],
    ) {
        let mut label = Vec::with_capacity(labels.len() + num_labels.len());
        for (k, v) in labels {
            label.push(Label {
                key: self.string(k),
                str: self.string(v),
                num: 0,
                num_unit: 0,
            });
        }
        for (k, v) in num_labels {
            label.push(Label {
                key: self.string(k),
                str: 0,
                num: *v,
                num_unit: 0,
            });
        }
        self.profile.sample.push(Sample {
            location_id: locations,
            value: values,
            label,
        });
    }

    pub(crate) fn finish(self) -> Profile {
        self.profile
    }
}

/// Encodes `profile` as gzip'd protobuf, the form pprof tools expect.
/// A pprof file, gzipped or not.
pub(crate) fn read_file(path: &std::path::Path) -> anyhow::Result<Profile> {
    use anyhow::Context as _;
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    if raw.starts_with(&[0x1f, 0x8b]) {
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&raw[..]), &mut bytes)
            .with_context(|| format!("decompressing {}", path.display()))?;
    } else {
        bytes = raw;
    }
    Profile::decode(&bytes[..])
        .with_context(|| format!("{} is not a pprof profile", path.display()))
}

pub(crate) fn encode_gzip(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let raw = profile.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_interns_and_roundtrips() {
        let mut b = ProfileBuilder::new(
            &[("samples", "count"), ("cpu-clock", "nanoseconds")],
            ("cpu-clock", "nanoseconds"),
            1000,
        );
        let m = b.mapping(
            &MappingKey {
                start: 0x1000,
                limit: 0x2000,
                file_offset: 0,
                filename: "/bin/x".into(),
                build_id: "abcd".into(),
            },
            true,
        );
        let leaf = [
            LineKey {
                function: "inlined".into(),
                file: "x.c".into(),
                line: 3,
            },
            LineKey {
                function: "outer".into(),
                file: "x.c".into(),
                line: 9,
            },
        ];
        let l1 = b.location(m, 0x1010, &leaf);
        assert_eq!(b.location(m, 0x1010, &leaf), l1);
        let l2 = b.location(m, 0x1100, &leaf[1..]);
        b.sample(vec![l1, l2], vec![1, 1000], &[("comm", "x")], &[("tid", 7)]);
        let p = b.finish();
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.location.len(), 2);
        // Both locations share the function `outer`.
        assert_eq!(p.function.len(), 2);
        assert_eq!(p.location[0].line.len(), 2);
        let gz = encode_gzip(&p).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        assert_eq!(Profile::decode(&raw[..]).unwrap(), p);
    }
}
