//! N5 in the hostile suite: a `/tools` flood from many conversations of one user (`user-1`) while
//! the bystander, another user, keeps calling `/tools` too (its `tools_write`/`tools_read`
//! operations). Eight conversations, each with a workspace of text files, are searched by
//! `grep_files` from six clients each at once. Every call is answered: 200, 429 `scope_busy` (a
//! conversation past `max_inflight_per_scope`) or 503 `busy`; never another status, never a hang.
//! Inside the `/tools` class one user holds at most `route_workers_per_user` workers, so the
//! bystander's calls find free ones (its latencies are judged with every other attack's).

use std::collections::BTreeMap;

use serde_json::json;

use super::attacks::{client, tool, Ans, Verdict};
use super::Hostile;

/// Conversations of the flooding user, clients per conversation, searches per client.
const CONVERSATIONS: usize = 8;
const CLIENTS: usize = 6;
const SEARCHES: usize = 3;

pub fn n5_tools_flood(h: &Hostile) -> Verdict {
    const NAME: &str = "N5 /tools flood from one user's conversations";
    let threads: Vec<String> = (0..CONVERSATIONS).map(|i| format!("thr-flood-{i}")).collect();
    let c = client();
    let text: String = (0..1000).map(|i| format!("line {i} of the haystack, needle{}\n", i % 97)).collect();
    for t in &threads {
        h.provision(t);
        for f in 0..8 {
            match tool(h, &c, t, "write_file", json!({"path": format!("hay/{f}.txt"), "content": text})) {
                Ok(a) if a.status == 200 => {}
                Ok(a) => return (NAME, Err(format!("seeding {t}: {} {:?}", a.status, a.code))),
                Err(e) => return (NAME, Err(format!("seeding {t}: {e}"))),
            }
        }
    }
    let answers: Vec<Result<Ans, String>> = std::thread::scope(|s| {
        let jobs: Vec<_> = threads
            .iter()
            .flat_map(|t| std::iter::repeat_n(t, CLIENTS))
            .map(|t| {
                s.spawn(move || {
                    let c = client();
                    let search = json!({"pattern": "needle(4[0-9]|9[0-6])$", "path": "/workspace"});
                    (0..SEARCHES).map(|_| tool(h, &c, t, "grep_files", search.clone())).collect::<Vec<_>>()
                })
            })
            .collect();
        jobs.into_iter().flat_map(|j| j.join().unwrap()).collect()
    });
    let mut by_status = BTreeMap::new();
    for a in answers {
        match a {
            Ok(a) if matches!((a.status, a.code.as_str()), (200, _) | (429, "scope_busy") | (503, "busy")) => {
                *by_status.entry(a.status).or_insert(0) += 1;
            }
            Ok(a) => return (NAME, Err(format!("a search answered {} {:?}: {}", a.status, a.code, a.body))),
            Err(e) => return (NAME, Err(format!("a search: {e}"))),
        }
    }
    if by_status.get(&200).copied().unwrap_or(0) == 0 {
        return (NAME, Err(format!("no search was served: {by_status:?}")));
    }
    (NAME, Ok(format!("{} searches by status {by_status:?}", CONVERSATIONS * CLIENTS * SEARCHES)))
}
