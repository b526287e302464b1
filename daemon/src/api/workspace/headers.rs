//! HTTP header pieces of the file routes: `Range` parsing (RFC 9110, one range), content types by
//! extension and a safe `Content-Disposition`.

use axum::http::HeaderValue;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

/// What a `Range` header asks of a file of `size` bytes (one range; anything else is served whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RangeAsk {
    Whole,
    /// Bytes `start..end` (end exclusive).
    Part(u64, u64),
    Unsatisfiable,
}

pub(super) fn parse_range(header: Option<&str>, size: u64) -> RangeAsk {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return RangeAsk::Whole;
    };
    if spec.contains(',') {
        return RangeAsk::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeAsk::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        return match b.parse::<u64>() {
            Ok(0) => RangeAsk::Unsatisfiable,
            Ok(_) if size == 0 => RangeAsk::Unsatisfiable,
            Ok(n) => RangeAsk::Part(size.saturating_sub(n), size),
            Err(_) => RangeAsk::Whole,
        };
    }
    let Ok(start) = a.parse::<u64>() else {
        return RangeAsk::Whole;
    };
    let end = if b.is_empty() {
        size
    } else {
        match b.parse::<u64>() {
            Ok(last) if last >= start => last.saturating_add(1).min(size),
            _ => return RangeAsk::Whole,
        }
    };
    if start >= size {
        RangeAsk::Unsatisfiable
    } else {
        RangeAsk::Part(start, end)
    }
}

pub(super) fn content_type(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" | "py" | "rs" | "js" | "ts" | "sh" | "toml" | "yaml" | "yml" | "tex" | "bib" => {
            "text/plain; charset=utf-8"
        }
        "md" => "text/markdown; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "json" => "application/json",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        _ => "application/octet-stream",
    }
}

/// `Content-Disposition` with an ASCII fallback and the exact UTF-8 name.
pub(super) fn disposition(kind: &str, name: &str) -> HeaderValue {
    let ascii: String = name
        .chars()
        .map(|c| if c.is_ascii_graphic() && !matches!(c, '"' | '\\' | ';') || c == ' ' { c } else { '_' })
        .collect();
    let exact = utf8_percent_encode(name, NON_ALPHANUMERIC);
    HeaderValue::from_str(&format!("{kind}; filename=\"{ascii}\"; filename*=UTF-8''{exact}"))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range(None, 10), RangeAsk::Whole);
        assert_eq!(parse_range(Some("bytes=0-3"), 10), RangeAsk::Part(0, 4));
        assert_eq!(parse_range(Some("bytes=4-"), 10), RangeAsk::Part(4, 10));
        assert_eq!(parse_range(Some("bytes=-3"), 10), RangeAsk::Part(7, 10));
        assert_eq!(parse_range(Some("bytes=-30"), 10), RangeAsk::Part(0, 10));
        assert_eq!(parse_range(Some("bytes=5-100"), 10), RangeAsk::Part(5, 10));
        assert_eq!(parse_range(Some("bytes=10-"), 10), RangeAsk::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-0"), 10), RangeAsk::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), RangeAsk::Unsatisfiable);
        // Malformed or multiple ranges are ignored: the whole file is served.
        assert_eq!(parse_range(Some("bytes=5-2"), 10), RangeAsk::Whole);
        assert_eq!(parse_range(Some("bytes=0-1,3-4"), 10), RangeAsk::Whole);
        assert_eq!(parse_range(Some("items=0-1"), 10), RangeAsk::Whole);
        assert_eq!(parse_range(Some("bytes=x-1"), 10), RangeAsk::Whole);
    }

    #[test]
    fn disposition_is_safe_and_exact() {
        let v = disposition("attachment", "résumé \"final\";.pdf");
        let s = v.to_str().unwrap();
        assert!(
            s.starts_with("attachment; filename=\"r_sum_ _final__.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9"),
            "{s}"
        );
        assert!(!s.contains('\n'));
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type("a.PDF"), "application/pdf");
        assert_eq!(content_type("notes.md"), "text/markdown; charset=utf-8");
        assert_eq!(content_type("noext"), "application/octet-stream");
    }
}
