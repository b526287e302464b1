//! The escape checks of a container that runs on a scope's mount (docker_isolation, peer_mounts):
//! the shell lines that look for a way out of `/workspace`, and the assertions on what they print.

/// The lines between `==NAME==` and the next `==...==` marker.
pub fn section<'a>(stdout: &'a str, name: &str) -> Vec<&'a str> {
    let marker = format!("=={name}==");
    stdout
        .lines()
        .skip_while(|l| *l != marker)
        .skip(1)
        .take_while(|l| !(l.starts_with("==") && l.ends_with("==")))
        .collect()
}

/// Shell lines printing four sections: `PARENT` (`ls -a /workspace/..`), `MOUNTINFO` (the
/// container's mount table), `FIND` (every file named `secret`, a shell word such as `"$NAME"`)
/// and `PEEK` (`REACHABLE <path>` for each of `peek` that can be listed). None may stop the script.
pub fn escape_probes(secret: &str, peek: &[&str]) -> String {
    let peek: Vec<String> = peek.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        "echo \"==PARENT==\"; ls -a /workspace/..\n\
         echo \"==MOUNTINFO==\"; cat /proc/self/mountinfo\n\
         echo \"==FIND==\"; find / -name {secret} 2>/dev/null || true\n\
         echo \"==PEEK==\"\n\
         for p in {}; do\n  if ls -a \"$p\" >/dev/null 2>&1; then echo \"REACHABLE $p\"; fi\ndone\n",
        peek.join(" ")
    )
}

/// What a container must not see of anything but its own mounts.
pub struct Hidden<'a> {
    /// Scope ids (its own included): no entry of `/workspace/..` may name one.
    pub scope_ids: &'a [&'a str],
    /// Other scopes' ids, other threads' ids, host paths: the mount table may not contain them.
    pub not_in_mountinfo: &'a [&'a str],
}

/// Asserts that the [`escape_probes`] in `stdout` found no way out: `/workspace/..` is the
/// container's root (no scope id, no mount root), the mount table shows nothing `hidden`, the
/// secret file is not found and no peeked path is reachable. Returns the mount table.
pub fn assert_no_escape(stdout: &str, hidden: &Hidden<'_>) -> String {
    let parent = section(stdout, "PARENT");
    for id in hidden.scope_ids {
        assert!(!parent.iter().any(|l| l.contains(id)), "`ls -a /workspace/..` shows scope {id}: {parent:?}");
    }
    assert!(
        !parent.contains(&"mnt") && parent.contains(&"workspace"),
        "`ls -a /workspace/..` is not the container's root: {parent:?}"
    );
    let mountinfo = section(stdout, "MOUNTINFO").join("\n");
    for needle in hidden.not_in_mountinfo {
        assert!(!mountinfo.contains(needle), "the container's mountinfo shows {needle:?}:\n{mountinfo}");
    }
    assert_eq!(section(stdout, "FIND"), Vec::<&str>::new(), "another scope's file is findable in the container");
    assert_eq!(section(stdout, "PEEK"), Vec::<&str>::new(), "another scope is reachable from the container");
    mountinfo
}
