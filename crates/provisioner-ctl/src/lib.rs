//! provisioner-ctl: the operator's commands for a split-provisioner, reading
//! Redis (and the Leases) directly: `status` ([`status`], rendered by [`table`])
//! and `queue list|dead|requeue <PV>` ([`queue`]); flags in [`cli`].

pub mod cli;
pub mod queue;
pub mod status;
pub mod table;

use cli::{OutputFormat, StatusArgs};

/// Gather ([`status::gather`]) with the `--redis-*` flags and `--kubeconfig` (unless
/// `--no-leases`), print a table or JSON. Errors: after printing, the count of
/// parts that could not be read (exit 1).
pub async fn run_status(
    common_args: &common::runtime::config::CommonArgs,
    args: &StatusArgs,
) -> anyhow::Result<()> {
    let names = if args.provisioner_names.is_empty() {
        vec![common_args.provisioner_name.clone()]
    } else {
        args.provisioner_names.clone()
    };
    let namespace = common_args.leader_election_namespace.as_deref();
    let mut client_error = None;
    let client = if args.no_leases {
        None
    } else {
        match common::runtime::kube_client::client_from_args(common_args, None).await {
            Ok(c) => Some(c),
            Err(e) => {
                client_error = Some(format!(
                    "leases: {}",
                    common::runtime::telemetry::error_chain(e.as_ref())
                ));
                None
            }
        }
    };
    let mut status = status::gather(
        &names,
        &common_args.redis(),
        client.as_ref().map(|c| (c, namespace)),
        common::kube::time::now_ms(),
    )
    .await;
    if let Some(e) = client_error {
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
    let errors = status.errors().len();
    anyhow::ensure!(errors == 0, "{errors} part(s) could not be read");
    Ok(())
}
