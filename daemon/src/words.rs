//! Messages for people: counts with the right noun.

/// `0 processes`, `1 process`, `2 processes`.
pub(crate) fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    #[test]
    fn nouns_agree_with_counts() {
        assert_eq!(super::count(0, "process", "processes"), "0 processes");
        assert_eq!(super::count(1, "process", "processes"), "1 process");
        assert_eq!(super::count(7, "burst", "bursts"), "7 bursts");
    }
}
