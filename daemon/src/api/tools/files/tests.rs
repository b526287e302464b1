//! Unit tests of `api::tools::files`.
use super::*;

#[test]
fn tool_paths_stay_in_the_workspace() {
    assert_eq!(tool_path("/workspace/a/b.txt", false).unwrap(), "a/b.txt");
    assert_eq!(tool_path("a//b.txt", false).unwrap(), "a/b.txt");
    assert_eq!(tool_path("/workspace", true).unwrap(), "");
    assert_eq!(tool_path(".", true).unwrap(), "");
    for bad in ["/etc/passwd", "../x", "/workspace/../x", "a/../../x", "a\u{1}b", "/workspace", "", "/workspacex/a"] {
        assert_eq!(tool_path(bad, false).unwrap_err().status, StatusCode::BAD_REQUEST, "{bad:?}");
    }
    assert!(tool_path("/workspace/.control/x", false).is_err());
}

#[test]
fn base64_round_trips_and_is_strict() {
    for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar", &[0, 255, 128, 7]] {
        assert_eq!(BASE64.decode(BASE64.encode(data)).unwrap(), data);
    }
    assert_eq!(BASE64.encode(b"foobar"), "Zm9vYmFy");
    assert_eq!(BASE64.encode(b"fo"), "Zm8=");
    // Padding required, canonical trailing bits, no whitespace (as the hand-written decoder was).
    for bad in ["Zm8", "Zm9=", "Z===", "Zm8=Zm8=", "Zm 8"] {
        assert!(BASE64.decode(bad).is_err(), "{bad}");
    }
}

/// The typed answers are the JSON the former `json!` bodies built (compared as JSON values).
#[test]
fn typed_answers_serialize_as_the_former_json_bodies() {
    use serde_json::json;
    let attr = Attr {
        ino: 7,
        kind: FileKind::Dir,
        perm: 0o755,
        nlink: 2,
        uid: 1000,
        gid: 1000,
        size: 4096,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH + std::time::Duration::from_millis(1500),
        ctime: UNIX_EPOCH,
        version: 1,
        rdev: 0,
    };
    let entry = DirEntryView::of(shown("a/b"), &attr);
    let listing = DirView { path: shown("a"), entries: vec![entry], truncated: false };
    let former = json!({
        "path": "/workspace/a",
        "entries": [{ "name": "b", "path": "/workspace/a/b", "type": "directory", "size_bytes": 4096, "mtime": 1.5 }],
        "truncated": false,
    });
    assert_eq!(serde_json::to_value(listing).unwrap(), former);

    let found = GrepMatch { path: shown("f.txt"), line_number: 3, line: "x".into() };
    let grep = GrepView { matches: vec![found], files_searched: 1, truncated: true };
    let former = json!({
        "matches": [{ "path": "/workspace/f.txt", "line_number": 3, "line": "x" }],
        "files_searched": 1,
        "truncated": true,
    });
    assert_eq!(serde_json::to_value(grep).unwrap(), former);
}
