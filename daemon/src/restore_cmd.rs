//! `scopefs restore --scope ID | --all`: rebuilds a data directory from the bucket alone (issue
//! 23): the registry when the disk has none, then each scope's metadata database from its shipped
//! snapshot and logs (`scopefs::engine::restore`). A scope that still has a local database is left
//! as it is. Refuses while a daemon runs on the data directory.

use anyhow::{bail, Context};
use scopefs::config::Config;
use scopefs::engine::restore;
use scopefs::ids::ScopeId;

use crate::{ops_cmd, registry_ship, setup};

/// Restores the registry (if missing) and `scope`, or every scope of the deployment with `all`;
/// prints one line a scope. Fails when a named scope has nothing in the bucket.
pub fn run(cfg: &Config, scope: Option<&str>, all: bool) -> anyhow::Result<()> {
    let _lock = crate::datadir_lock::for_command(&cfg.data_dir, "restore")?;
    setup::control_dir(cfg).context("preparing the control directory")?;
    let rt = setup::runtime()?;
    let store = {
        let _in_runtime = rt.enter();
        setup::build_store(cfg).context("configuring the object store")?
    };
    let registry_path = setup::registry_path(cfg);
    if cfg.registry.url.is_some() {
        println!("registry: in PostgreSQL ([registry] url); nothing to restore");
    } else if rt.block_on(registry_ship::restore_if_missing(store.as_ref(), &registry_path))? {
        println!("registry: restored from the object store");
    } else if registry_path.exists() {
        println!("registry: a local registry exists; left as it is");
    } else {
        println!("registry: none in the object store (a new deployment)");
    }
    let ids: Vec<ScopeId> = match (scope, all) {
        (Some(id), false) => vec![ScopeId::parse(id).context("invalid scope id")?],
        (None, true) => {
            let registry = ops_cmd::open_registry(cfg)?;
            let scopes = registry.list().context("reading the registry")?;
            scopes.into_iter().filter(|s| s.state.is_mountable()).map(|s| s.scope_id).collect()
        }
        _ => bail!("name one scope (--scope ID) or every scope (--all)"),
    };
    // Several nodes: a scope's state is the head its placement records, not the bucket's newest.
    let placements = match cfg.node.id {
        Some(_) => Some(ops_cmd::open_registry(cfg)?),
        None => None,
    };
    let mut restored = 0usize;
    for id in &ids {
        let db = cfg.data_dir.join("scopes").join(id.as_str()).join("meta.sqlite3");
        if db.exists() {
            println!("scope {id}: a local database exists; left as it is");
            continue;
        }
        let upto = match &placements {
            Some(registry) => {
                let p = registry.placement(id).context("reading the scope's placement")?;
                Some(p.and_then(|p| p.head).map(|h| (h.gen, h.seq, h.state)))
            }
            None => None,
        };
        match rt.block_on(restore::restore_scope(store.as_ref(), id.as_str(), &db, upto)) {
            Ok(Some(r)) => {
                restored += 1;
                println!(
                    "scope {id}: restored to batch {} from {} objects ({} batches replayed, {} blocks missing)",
                    r.seq, r.objects, r.batches, r.blocks_missing
                );
            }
            Ok(None) if scope.is_some() => bail!("scope {id}: the object store holds no metadata of it"),
            Ok(None) => println!("scope {id}: the object store holds no metadata of it (never written?)"),
            Err(e) => bail!("scope {id}: restore failed: {e}"),
        }
    }
    println!("restored {restored} of {} scopes", ids.len());
    Ok(())
}
