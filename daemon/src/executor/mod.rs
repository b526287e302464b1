//! Sandboxed execution (SPEC §8): the Docker executor the daemon drives (`docker`), its container
//! policy (`policy`), the test executor (`fake`) and the startup checks of strict mode (`build`).
//! The compute work itself is `crate::services::ComputeService`.

pub mod docker;
#[cfg(test)]
pub mod fake;
pub mod policy;

use std::sync::Arc;

use scopefs::config::{Config, Isolation};
use scopefs::executor::Executor;

/// Builds the Docker executor of `cfg` and applies the startup policy: in strict mode
/// (`isolation = "required"`) a weak setting, an unreachable engine or a missing image is an error
/// naming the problem; in optional mode weak settings are logged and an unreachable engine only
/// makes the compute tools answer 503.
pub fn build(cfg: &Config, rt: tokio::runtime::Handle) -> anyhow::Result<Arc<dyn Executor>> {
    let e = &cfg.executor;
    let weak = policy::weaknesses(e);
    let socket = e.docker_socket().ok_or_else(|| anyhow::anyhow!("executor.docker_host must be a Unix socket"))?;
    let docker = docker::DockerExecutor::new(socket, policy::ContainerPolicy::from_config(e), rt);
    match e.isolation {
        Isolation::Required => {
            if !weak.is_empty() {
                anyhow::bail!(
                    "strict isolation (executor.isolation = \"required\") refuses this configuration:\n  - {}",
                    weak.join("\n  - ")
                );
            }
            docker.ping().map_err(|err| {
                anyhow::anyhow!(
                    "strict isolation (executor.isolation = \"required\") needs a reachable Docker engine at \
                     executor.docker_host = {:?}: {err}",
                    e.docker_host
                )
            })?;
            docker.image_present().map_err(|err| {
                anyhow::anyhow!(
                    "strict isolation (executor.isolation = \"required\"): executor.image = {:?} is not usable: {err}",
                    e.image
                )
            })?;
        }
        Isolation::Optional => {
            for w in &weak {
                tracing::warn!(weakness = %w, "sandbox policy is weakened (isolation = \"optional\")");
            }
            if let Err(err) = docker.ping() {
                tracing::warn!(error = %err, "Docker engine not reachable; compute tools answer 503 until it is");
            }
        }
    }
    Ok(Arc::new(docker))
}
