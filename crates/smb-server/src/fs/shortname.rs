//! 8.3 alternate names (MS-FSCC 2.1.5.2.1), made up from the long name: nothing is stored, and
//! a file cannot be opened by its short name. A name that is already a valid 8.3 name has no
//! other short name (directory listings leave ShortName empty); FileAlternateNameInformation
//! then answers the name itself in upper case.

/// Characters a short name may hold besides letters and digits.
const SHORT_EXTRA: &str = "!#$%&'()-@^_`{}~";

fn short_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || SHORT_EXTRA.contains(c)
}

/// Whether `name` is a valid 8.3 name: a base of 1 to 8 characters, at most one dot and an
/// extension of 1 to 3, all of them allowed in short names.
pub fn is_8_3(name: &str) -> bool {
    let (base, ext) = match name.split_once('.') {
        Some((b, e)) => (b, Some(e)),
        None => (name, None),
    };
    let ok = |s: &str, max: usize| !s.is_empty() && s.len() <= max && s.chars().all(short_char);
    ok(base, 8) && ext.is_none_or(|e| ok(e, 3))
}

/// The generated short name of a long name that is not 8.3: up to five characters of the
/// base, `~`, two characters from a hash of the whole name, and up to three characters of the
/// last extension, upper case (`torture_search.txt` gives `TORTU~XY.TXT`). None for a name that
/// is already 8.3, `.` and `..`.
pub fn generated(name: &str) -> Option<String> {
    if name == "." || name == ".." || is_8_3(name) {
        return None;
    }
    let (base, ext) = match name.rsplit_once('.') {
        Some((b, e)) if !b.is_empty() => (b, e),
        _ => (name, ""),
    };
    let pick = |s: &str, n: usize| -> String {
        s.chars()
            .filter(|c| short_char(*c))
            .map(|c| c.to_ascii_uppercase())
            .take(n)
            .collect()
    };
    let mut out = pick(base, 5);
    if out.is_empty() {
        out.push('_');
    }
    // FNV-1a over the name, folded to two base-36 digits: the same name, the same short name.
    let mut h: u32 = 0x811c_9dc5;
    for b in name.to_uppercase().bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let d = |v: u32| char::from(DIGITS.get((v % 36) as usize).copied().unwrap_or(b'0'));
    out.push('~');
    out.push(d(h / 36));
    out.push(d(h));
    let ext = pick(ext, 3);
    if !ext.is_empty() {
        out.push('.');
        out.push_str(&ext);
    }
    Some(out)
}

/// FileAlternateNameInformation's name for the last component of `name` (empty for the
/// share root).
pub fn alternate(name: &str) -> String {
    let last = name.rsplit('\\').next().unwrap_or(name);
    if last.is_empty() {
        return String::new();
    }
    generated(last).unwrap_or_else(|| last.to_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names() {
        assert!(is_8_3("FILE.TXT"));
        assert!(is_8_3("readme"));
        assert!(!is_8_3("torture_search.txt"));
        assert!(!is_8_3("a.b.c"));
        assert!(!is_8_3("abc.text"));
        assert!(!is_8_3("has space.txt"));
        assert_eq!(generated("FILE.TXT"), None);
        assert_eq!(generated(".."), None);
        let s = generated("torture_search.txt").unwrap();
        assert!(
            s.starts_with("TORTU~") && s.ends_with(".TXT") && s.len() == 12,
            "{s}"
        );
        assert!(is_8_3(&s));
        assert_eq!(
            generated("torture_search.txt"),
            generated("TORTURE_SEARCH.TXT")
        );
        assert_ne!(
            generated("torture_search.txt"),
            generated("torture_searcH2.txt")
        );
        assert!(is_8_3(&generated(".bashrc").unwrap()));
        assert!(is_8_3(&generated("a b c d e f").unwrap()));
        assert_eq!(alternate("dir\\FILE.TXT"), "FILE.TXT");
        assert_eq!(alternate("dir\\file.txt"), "FILE.TXT");
        assert_eq!(alternate("x\\torture_search.txt"), s);
        assert_eq!(alternate(""), "");
    }
}
