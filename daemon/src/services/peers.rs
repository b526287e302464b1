//! Views outside a request's own workspace (seed 003 §3.7, §6.2): which user a scope belongs to,
//! the scope a `/threads/{thread_id}` or `/__global__` path names for a user, and the user's global
//! store, a scope of its own created on first use under a reserved thread id
//! (`ThreadId::global_store`) and made `active` at once (a draft would expire).
//!
//! Rules, the same for the file tools and for container mounts:
//! - A scope belongs to the first user that provisioning or a signed tool request names; a request
//!   of another user is answered like an unknown thread (404).
//! - `/threads/{id}` names the scope of thread `id` only if that scope belongs to the same user and
//!   is draft or active; anything else (unknown, another user's, a scope no user was bound to,
//!   deleted) is `ScopeNotFound` (404), deleting is `NotMountable(Deleting)`. Read-only always.
//! - `/__global__` names the requesting user's global store (seed 003 §3.3: "user-global
//!   read-write"); reading it needs no grant, writing it through the file tools needs an
//!   `object_scope` write prefix covering it. A container gets it read-write when its grant says
//!   so (an `input_objects` entry under `/__global__` with `read_only: false`, as the seed's
//!   manifest writes them, a caller that may write, and no `object_scope` that withholds writing
//!   `/__global__`), read-only otherwise.

use scopefs::executor::ViewMount;
use scopefs::ids::{IdError, ThreadId};
use scopefs::registry::{DeploymentRegistry, RegistryError, ScopeRecord, ScopeState};

use super::open_scopes::OpenScopes;
use super::{require_open_state, ServiceError};

/// The container and tool path of the user's global store.
pub const GLOBAL_ROOT: &str = "/__global__";
/// The container and tool path below which peer threads appear (`/threads/{thread_id}`).
pub const THREADS_ROOT: &str = "/threads";

/// A view outside the request's own `/workspace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum View {
    /// Another thread's scope, read-only.
    Thread(ThreadId),
    /// The user's global store.
    Global,
}

impl View {
    /// Splits a path rooted at `/threads/{id}` or `/__global__` into its view and the rest below it
    /// (`""` for the root itself, not yet normalized). `None`: the path is rooted elsewhere;
    /// `Some(Err)`: `/threads` without a valid thread id (reserved ids included).
    pub fn split(path: &str) -> Option<Result<(View, &str), IdError>> {
        if path == GLOBAL_ROOT {
            return Some(Ok((View::Global, "")));
        }
        if let Some(rest) = path.strip_prefix(GLOBAL_ROOT).and_then(|r| r.strip_prefix('/')) {
            return Some(Ok((View::Global, rest)));
        }
        let rest = match path.strip_prefix(THREADS_ROOT)? {
            "" | "/" => return Some(Err(IdError::BadThreadId)),
            r => r.strip_prefix('/')?,
        };
        let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
        Some(ThreadId::parse(id).map(|t| (View::Thread(t), tail)))
    }

    /// The path of the view's root, in containers and in tool answers.
    pub fn root(&self) -> String {
        match self {
            View::Thread(t) => format!("{THREADS_ROOT}/{}", t.as_str()),
            View::Global => GLOBAL_ROOT.to_string(),
        }
    }
}

/// Binds `rec` to `user` if no user owns it yet; a scope of another user is `ScopeNotFound`.
pub fn bind_user(registry: &DeploymentRegistry, rec: &ScopeRecord, user: &str) -> Result<(), ServiceError> {
    let owner = match &rec.user_id {
        Some(u) => u.clone(),
        None => match registry.bind_scope_user(&rec.scope_id, user) {
            Ok(u) => u,
            Err(RegistryError::NotFound) => return Err(ServiceError::ScopeNotFound),
            Err(e) => return Err(e.into()),
        },
    };
    if owner == user {
        Ok(())
    } else {
        Err(ServiceError::ScopeNotFound)
    }
}

/// The scope `view` names for `user` (rules in the module docs); the global store is created
/// (and mounted) on first use.
pub fn resolve(
    registry: &DeploymentRegistry,
    open: &OpenScopes,
    user: &str,
    view: &View,
) -> Result<ScopeRecord, ServiceError> {
    match view {
        View::Thread(thread) => {
            let rec = registry.find_by_thread(thread)?.ok_or(ServiceError::ScopeNotFound)?;
            if rec.user_id.as_deref() != Some(user) {
                return Err(ServiceError::ScopeNotFound);
            }
            require_open_state(rec.state)?;
            Ok(rec)
        }
        View::Global => global_store(registry, open, user),
    }
}

/// A view a request grants a container, and whether it may write there (only `/__global__` can be
/// writable; module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewGrant {
    pub view: View,
    pub writable: bool,
}

/// The binds of the views of one container, and the user's global store when it is bound writable
/// (its changed files are outputs of the environment).
#[derive(Debug, Default)]
pub struct MountedViews {
    pub mounts: Vec<ViewMount>,
    pub writable_global: Option<ScopeRecord>,
}

/// Mounts the scopes of `views` for `user` (rules in the module docs) and returns their binds for a
/// container. Each view's scope keeps its one shared mount (it lives as long as the scope is
/// draft/active); the container's bind of it ends with the container.
pub fn mount_views(
    registry: &DeploymentRegistry,
    open: &OpenScopes,
    user: &str,
    views: &[ViewGrant],
) -> Result<MountedViews, ServiceError> {
    let mut out = MountedViews { mounts: Vec::with_capacity(views.len()), writable_global: None };
    for grant in views {
        let target = grant.view.root();
        if out.mounts.iter().any(|v| v.target == target) {
            continue;
        }
        let rec = resolve(registry, open, user, &grant.view)?;
        let writable = grant.writable && grant.view == View::Global;
        out.mounts.push(ViewMount { source: open.mount(&rec)?, target, read_only: !writable });
        if writable {
            out.writable_global = Some(rec);
        }
    }
    Ok(out)
}

/// The global store of `user`, created, mounted and bound to `user` on first use.
fn global_store(registry: &DeploymentRegistry, open: &OpenScopes, user: &str) -> Result<ScopeRecord, ServiceError> {
    let thread = ThreadId::global_store(user);
    let rec = match registry.find_by_thread(&thread)? {
        Some(rec) => rec,
        None => match registry.create_scope(&thread, None) {
            Ok(rec) => rec,
            // Created meanwhile by a concurrent first use.
            Err(RegistryError::ThreadAlreadyBound(_)) => {
                registry.find_by_thread(&thread)?.ok_or(ServiceError::ScopeNotFound)?
            }
            Err(e) => return Err(e.into()),
        },
    };
    let mut rec = if rec.state == ScopeState::Provisioning {
        open.mount(&rec)?;
        let done = registry.complete_provision(&rec.scope_id)?;
        tracing::info!(scope_id = %done.scope_id, "global store provisioned");
        done
    } else {
        rec
    };
    // Active at once: no WebUI thread ever activates it, and a draft would expire (`draft_ttl`).
    if rec.state == ScopeState::Draft {
        rec = match registry.transition(&rec.scope_id, rec.revision, ScopeState::Active) {
            Ok(done) => done,
            // Activated meanwhile by a concurrent first use.
            Err(RegistryError::Conflict { .. }) => registry.get(&rec.scope_id)?.ok_or(ServiceError::ScopeNotFound)?,
            Err(e) => return Err(e.into()),
        };
    }
    bind_user(registry, &rec, user)?;
    rec.user_id = Some(user.to_string());
    require_open_state(rec.state)?;
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_paths_split_into_view_and_rest() {
        let t = |s: &str| View::Thread(ThreadId::parse(s).unwrap());
        assert_eq!(View::split("/__global__").unwrap().unwrap(), (View::Global, ""));
        assert_eq!(View::split("/__global__/a/b").unwrap().unwrap(), (View::Global, "a/b"));
        assert_eq!(View::split("/threads/thr_1").unwrap().unwrap(), (t("thr_1"), ""));
        assert_eq!(View::split("/threads/thr_1/x/y.txt").unwrap().unwrap(), (t("thr_1"), "x/y.txt"));
        assert_eq!(t("thr_1").root(), "/threads/thr_1");
        assert_eq!(View::Global.root(), "/__global__");
        for elsewhere in ["/workspace/a", "a/b", "/__global__x", "/threadsx/a", "/etc"] {
            assert!(View::split(elsewhere).is_none(), "{elsewhere}");
        }
        for bad in ["/threads", "/threads/", "/threads/a b/x", "/threads/__global__.u1/x", "/threads//x"] {
            assert!(matches!(View::split(bad), Some(Err(_))), "{bad}");
        }
    }
}
