//! Hot data streams as pprof, for the push destinations (`APP.streams`):
//! one sample per stream, its "stack" its access signature (the first
//! reference at the root, so a flame graph reads each stream top down in
//! the order it runs), valued by the references it accounts for and its
//! occurrences, labelled with its rank and address pattern.
use super::pprof::{LineKey, MappingKey, ProfileBuilder, encode_gzip};
use crate::hot_streams::Report;

/// The gzip'd pprof of `report`, a window from `start` lasting
/// `duration_nanos`.
pub(crate) fn streams_pprof(
    report: &Report,
    start_nanos: i64,
    duration_nanos: i64,
) -> std::io::Result<Vec<u8>> {
    let mut b = ProfileBuilder::new(
        &[("references", "count"), ("occurrences", "count")],
        ("references", "count"),
        1,
    );
    b.set_time(start_nanos, duration_nanos);
    b.set_default_sample_type("references");
    b.add_comment(&format!(
        "hot data streams: {} references traced, the streams hold {:.1}% of them",
        report.references,
        100.0 * report.hot_share
    ));
    for (rank, s) in report.streams.iter().enumerate() {
        let mut locations: Vec<u64> = s
            .signature
            .iter()
            .map(|site| {
                let mapping = b.mapping(
                    &MappingKey {
                        start: 0,
                        limit: 0,
                        file_offset: 0,
                        filename: site.module.clone(),
                        build_id: site.build_id.clone().unwrap_or_default(),
                    },
                    true,
                );
                let address = u64::from_str_radix(site.address.trim_start_matches("0x"), 16)
                    .unwrap_or_default();
                let (file, line) = site
                    .line
                    .as_deref()
                    .and_then(|l| l.rsplit_once(':'))
                    .map(|(f, n)| (f.to_string(), n.parse().unwrap_or(0)))
                    .unwrap_or_default();
                let function = site
                    .function
                    .clone()
                    .unwrap_or_else(|| format!("{}+{}", basename(&site.module), site.address));
                b.location(
                    mapping,
                    address,
                    &[LineKey {
                        function,
                        file,
                        line,
                    }],
                )
            })
            .collect();
        // pprof's stacks are leaf first.
        locations.reverse();
        let refs = (s.frequency as i64).saturating_mul(s.length as i64);
        b.sample(
            locations,
            vec![refs, s.frequency as i64],
            &[("pattern", s.pattern.as_str())],
            &[("stream", rank as i64 + 1), ("length", s.length as i64)],
        );
    }
    encode_gzip(&b.finish())
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::pprof::Profile;
    use crate::hot_streams::{RefSite, StreamOut};
    use prost::Message;

    /// One sample per stream, its signature root first, valued by
    /// frequency × length and frequency.
    #[test]
    fn a_stream_is_a_sample_with_its_signature_as_stack() {
        let site = |a: &str, f: &str| RefSite {
            module: "/bin/walk".into(),
            build_id: Some("ab12".into()),
            address: a.into(),
            function: Some(f.into()),
            line: Some("walk.c:7".into()),
        };
        let report = Report {
            references: 1000,
            dropped: 0,
            hot_share: 0.3,
            min_length: 2,
            max_length: 40,
            streams: vec![StreamOut {
                signature: vec![site("0x1130", "first"), site("0x1140", "second")],
                heat: 0.3,
                frequency: 150,
                length: 2,
                pattern: "stride".into(),
                strides: vec![16],
                example: vec![],
            }],
        };
        let gz = streams_pprof(&report, 0, 1).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        let p = Profile::decode(&raw[..]).unwrap();
        assert_eq!(p.sample.len(), 1);
        assert_eq!(p.sample[0].value, [300, 150]);
        let name = |loc: u64| {
            let l = &p.location[loc as usize - 1];
            let f = &p.function[l.line[0].function_id as usize - 1];
            (l.address, p.string_table[f.name as usize].clone())
        };
        // Leaf first: the stream's last reference.
        assert_eq!(name(p.sample[0].location_id[0]), (0x1140, "second".into()));
        assert_eq!(name(p.sample[0].location_id[1]), (0x1130, "first".into()));
    }
}
