//! Sizes as people write them: `4096`, `512M`, `2G`, `1.5GiB`, `64k`.
//! Units are binary (K = 1024), as for memory everywhere else.

/// Parse a size in bytes. Refuses empty, negative, fractional bytes and
/// anything that overflows.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        u => return Err(format!("unknown unit {u:?} in size {text:?} (use K, M, G or T)")),
    };
    let value: f64 = num.parse().map_err(|_| format!("{text:?} is not a size"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(format!("size {text:?} is not a whole number of bytes in range"));
    }
    Ok(bytes as u64)
}

/// Parse a size that must be a non-zero whole number of 4 KiB pages.
pub fn parse_pages(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text)?;
    if bytes == 0 || bytes % memlend_store::PAGE_SIZE as u64 != 0 {
        return Err(format!("size {text:?} must be a non-zero multiple of 4 KiB"));
    }
    Ok(bytes / memlend_store::PAGE_SIZE as u64)
}

/// Print bytes for people: `1.5 GiB`, `512 MiB`, `4.0 KiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size(" 64k "), Ok(64 << 10));
        assert!(parse_size("").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("1.5").is_err());
        assert!(parse_size("3X").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(parse_pages("8K"), Ok(2));
        assert!(parse_pages("6K").is_err());
        assert!(parse_pages("0").is_err());
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
