//! provisioner-ctl: the operator's commands for a split-provisioner, reading
//! Redis (and the Leases) directly: `status` ([`status`], rendered by [`table`])
//! and `queue list|dead|requeue <PV>` ([`queue`]); flags in [`cli`].

pub mod cli;
pub mod queue;
pub mod status;
pub mod table;

use cli::{OutputFormat, StatusArgs};
use common::kube::time::now_ms;
use common::runtime::{kube_client::client_from_args, telemetry::error_chain};

/// Gather ([`status::gather`]) with the `--redis-*` flags and `--kubeconfig` (unless
/// `--no-leases`), print a table or JSON. Errors: after printing, the count of
/// parts that could not be read (exit 1).
pub async fn run_status(
    common_args: &common::runtime::config::ClusterArgs,
    args: &StatusArgs,
) -> anyhow::Result<()> {
    let names = if args.provisioner_names.is_empty() {
        vec![common_args.provisioner_name.clone()]
    } else {
        args.provisioner_names.clone()
    };
    let client = match args.no_leases {
        true => None,
        false => Some(client_from_args(common_args, None).await),
    };
    let namespace = common_args.leader_election_namespace.as_deref();
    let leases = client
        .as_ref()
        .and_then(|c| Some((c.as_ref().ok()?, namespace)));
    let mut status = status::gather(&names, &common_args.redis(), leases, now_ms()).await;
    if let Some(Err(e)) = client {
        let e = format!("leases: {}", error_chain(e.as_ref()));
        for p in &mut status.provisioners {
            p.errors.push(e.clone());
        }
    }
    match args.output {
        OutputFormat::Table => print!("{}", table::render_table(&status)),
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&status).expect("status always serializes")
        ),
    }
    // The causes are in the output already; the exit error only counts them.
    let errors: usize = status.provisioners.iter().map(|p| p.errors.len()).sum();
    anyhow::ensure!(errors == 0, "{errors} part(s) could not be read");
    Ok(())
}
