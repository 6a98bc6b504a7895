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

#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
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

#[derive(Clone, PartialEq, Message)]
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

#[derive(Clone, PartialEq, Message)]
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

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
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

/// A mapping as the builder's caller describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MappingKey {
    pub start: u64,
    pub limit: u64,
    pub file_offset: u64,
    pub filename: String,
    pub build_id: String,
}

/// One source-level frame of a location (innermost inlined first).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LineKey {
    pub function: String,
    pub file: String,
    pub line: i64,
}

/// Builds a [`Profile`], interning strings, functions, mappings and
/// locations so each appears once.
pub struct ProfileBuilder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    mappings: HashMap<MappingKey, u64>,
    locations: HashMap<(u64, u64, Vec<LineKey>), u64>,
}

impl ProfileBuilder {
    /// `sample_types` are (type, unit) pairs, e.g. `("samples", "count")`.
    pub fn new(sample_types: &[(&str, &str)], period_type: (&str, &str), period: i64) -> Self {
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

    pub fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    pub fn set_time(&mut self, time_nanos: i64, duration_nanos: i64) {
        self.profile.time_nanos = time_nanos;
        self.profile.duration_nanos = duration_nanos;
    }

    pub fn set_default_sample_type(&mut self, t: &str) {
        self.profile.default_sample_type = self.string(t);
    }

    pub fn add_comment(&mut self, c: &str) {
        let i = self.string(c);
        self.profile.comment.push(i);
    }

    pub fn mapping(&mut self, key: &MappingKey, symbolized: bool) -> u64 {
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
    pub fn location(&mut self, mapping_id: u64, address: u64, lines: &[LineKey]) -> u64 {
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
    pub fn sample(
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

    pub fn finish(self) -> Profile {
        self.profile
    }
}

/// Encodes `profile` as gzip'd protobuf, the form pprof tools expect.
pub fn encode_gzip(profile: &Profile) -> std::io::Result<Vec<u8>> {
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
            &[("samples", "count"), ("cpu-clock", "count")],
            ("cpu-clock", "count"),
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
