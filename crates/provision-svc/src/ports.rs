//! The side effects of the provision operation, behind small traits so the
//! seed's decision logic can be tested without a cluster or Redis:
//!
//! * [`ClusterApi`] — node lookup, the reschedule PATCH, claim events
//!   ([`KubeCluster`] over the Kubernetes API);
//! * [`PvHandoff`] — pv-writer's durable queue ([`common::handoff::queue::PvQueue`]);
//! * [`IntentLog`] — durable provisioning intents ([`common::handoff::intents::IntentStore`]).
//!
//! Errors are [`EffectError`]s: every caller turns them into an event or a
//! log line and a retry.

use std::future::Future;

use api_types::queue::{ProvisionIntent, QueuedPvWrite};
use api_types::ANN_SELECTED_NODE;
use async_trait::async_trait;
use common::handoff::intents::{IntentEntry, IntentError, IntentStore};
use common::handoff::queue::{PvQueue, QueueError};
use common::handoff::queue_auth::QueueKey;
use common::kube::events::{event, reason, EventSink};
use futures::channel::mpsc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::ClusterResourceScope;
use kube::runtime::events::Event;
use kube::{Client, Resource, ResourceExt};

/// Why a side effect of the provision operation failed; its text goes into
/// the claim's events and logs, and the claim is retried.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// A Kubernetes API call failed; `call` names it (verb, kind, name).
    #[error("{call}: {}", brief(source))]
    Kube {
        /// The call, e.g. `get PersistentVolume "pvc-1"`.
        call: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// pv-writer's queue in Redis failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The provisioning intents in Redis failed.
    #[error(transparent)]
    Intents(#[from] IntentError),
    /// An empty object name (the API server's own wording).
    #[error("resource name may not be empty")]
    EmptyName,
}

/// The API server's own message and reason for an API error (what an event
/// should say), else the client's error.
fn brief(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.reason),
        other => other.to_string(),
    }
}

/// `Result` of a side effect.
pub type Effect<T> = Result<T, EffectError>;

/// A failed Kubernetes `call`, as [`EffectError::Kube`].
fn kube_failed(call: String) -> impl FnOnce(kube::Error) -> EffectError {
    move |source| EffectError::Kube { call, source }
}

/// Kubernetes calls the provision operation makes.
#[async_trait]
pub trait ClusterApi: Send + Sync + 'static {
    /// GET the node `name`: `Ok(None)` when it does not exist (404), `Err` for
    /// any other failure (seed: "failed to get target node").
    async fn get_node(&self, name: &str) -> Effect<Option<Node>>;

    /// Whether the PV `name` exists, by a live GET on the API server (never a
    /// cache, which may lag): `Ok(false)` only on 404, `Err` for any other failure.
    async fn pv_exists(&self, name: &str) -> Effect<bool> {
        Ok(self.get_pv(name).await?.is_some())
    }

    /// Whether the claim `namespace/name` exists with `uid`, by a live list
    /// limited to that name (never a cache); `Err` when the API call failed.
    async fn claim_exists(&self, namespace: &str, name: &str, uid: &str) -> Effect<bool>;

    /// Remove `volume.kubernetes.io/selected-node` from `claim`: a merge patch
    /// conditional on its resourceVersion (seed's `Update`); 409 Conflict (the
    /// claim changed) is `Ok`, the next sync decides.
    async fn remove_selected_node(&self, claim: &PersistentVolumeClaim) -> Effect<()>;

    /// GET the PV `name` live (never a cache): `Ok(None)` on 404.
    async fn get_pv(&self, name: &str) -> Effect<Option<PersistentVolume>>;

    /// Every PV, listed live in pages (never a cache).
    async fn list_pvs(&self) -> Effect<Vec<PersistentVolume>>;

    /// Merge-patch the PV `name` with `patch` (its capacity after an expansion).
    async fn patch_pv(&self, name: &str, patch: &serde_json::Value) -> Effect<()>;

    /// Merge-patch the status subresource of `claim` with `patch` (its capacity and conditions;
    /// a list is replaced whole, as v1.19 does not merge claim conditions by `type`).
    async fn patch_claim_status(
        &self,
        claim: &PersistentVolumeClaim,
        patch: &serde_json::Value,
    ) -> Effect<()>;

    /// Record an event on `claim` (Normal, or Warning when `warning`). Never
    /// fails and never blocks on the API server: events are informative.
    fn claim_event(&self, claim: &PersistentVolumeClaim, warning: bool, reason: &str, note: String);
}

/// Where the queue entry of a claim's PV stands ([`PvHandoff::queued_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueuedState {
    /// Nothing is queued under the PV name.
    No,
    /// A valid entry for the claim is queued: pv-writer will write it.
    Yes,
    /// Something is queued under the PV name that pv-writer will never write
    /// for this claim (dead-lettered, or not signed by us for this claim): why.
    Stalled {
        /// Metric label: `dead_lettered` or `unverifiable`.
        kind: &'static str,
        /// What is wrong, for the claim's Warning event.
        reason: String,
    },
}

/// pv-writer's durable queue, as provision-svc uses it.
#[async_trait]
pub trait PvHandoff: Send + Sync + 'static {
    /// Whether a PV write for `pv_name` is queued and not yet done.
    async fn is_pending(&self, pv_name: &str) -> Effect<bool>;
    /// Whether what is queued under `pv_name` is a live entry for the claim
    /// `claim_uid` (verified with the queue key, not dead-lettered).
    async fn queued_state(&self, pv_name: &str, claim_uid: &str) -> Effect<QueuedState>;
    /// The entry queued under `pv_name` when it verifies as ours for the claim
    /// `claim_uid` (pending or dead-lettered); `None` otherwise.
    async fn queued_entry(&self, pv_name: &str, claim_uid: &str) -> Effect<Option<QueuedPvWrite>>;
    /// Queue `entry` (atomic, idempotent per PV name) and, in the same atomic
    /// step, clear the PV's provisioning intent.
    async fn enqueue(&self, entry: &QueuedPvWrite) -> Effect<()>;
}

/// Whether the intent `entry` is flagged as provisioning in background.
pub fn is_in_background(entry: &IntentEntry) -> bool {
    entry.claim.as_ref().is_some_and(|c| c.in_background)
}

/// Durable provisioning intents, as provision-svc uses them; the intent's
/// in-background flag is the only record of a claim provisioning in background.
#[async_trait]
pub trait IntentLog: Send + Sync + 'static {
    /// Record `intent` with a snapshot of `claim`; `in_background` sets the
    /// flag, `None` keeps the recorded one (false for a new intent).
    async fn record(
        &self,
        intent: &ProvisionIntent,
        claim: &PersistentVolumeClaim,
        in_background: Option<bool>,
    ) -> Effect<()>;
    /// Clear the intent of `pv_name` (none recorded: nothing to do).
    async fn clear(&self, pv_name: &str) -> Effect<()>;
    /// The intent of `pv_name` with its claim snapshot, `None` when none is
    /// recorded. Errors: Redis, or an unreadable intent.
    async fn entry(&self, pv_name: &str) -> Effect<Option<IntentEntry>>;
    /// Every readable intent, and how many are stored (readable or not).
    async fn list(&self) -> Effect<(Vec<IntentEntry>, usize)>;
}

/// The real [`PvHandoff`]: pv-writer's Redis queue, every entry signed with the
/// queue key ([`common::handoff::queue_auth`]) before it is stored.
pub struct SignedQueue {
    queue: PvQueue,
    key: Option<QueueKey>,
    provisioner_name: String,
}

impl SignedQueue {
    /// Enqueue into `queue`, signing for `provisioner_name`'s queue with `key`
    /// (`None`: unsigned, `--insecure-unsigned-queue`).
    pub fn new(queue: PvQueue, key: Option<QueueKey>, provisioner_name: &str) -> Self {
        SignedQueue {
            queue,
            key,
            provisioner_name: provisioner_name.to_string(),
        }
    }

    /// `payload` decoded, its MAC verified (unless unsigned on purpose) and
    /// checked to be the PV `pv_name` of the claim `claim_uid`.
    fn verified(
        &self,
        payload: &[u8],
        pv_name: &str,
        claim_uid: &str,
    ) -> anyhow::Result<QueuedPvWrite> {
        let entry = QueuedPvWrite::decode(payload)?;
        if let Some(key) = &self.key {
            key.verify(&self.provisioner_name, &entry)?;
        }
        let (pv, uid) = (entry.pv_name(), &entry.claim.uid);
        if pv != pv_name || uid != claim_uid {
            anyhow::bail!("it is for PV {pv:?} of claim uid {uid}");
        }
        Ok(entry)
    }
}

#[async_trait]
impl PvHandoff for SignedQueue {
    async fn is_pending(&self, pv_name: &str) -> Effect<bool> {
        Ok(self.queue.is_pending(pv_name).await?)
    }

    async fn queued_entry(&self, pv_name: &str, claim_uid: &str) -> Effect<Option<QueuedPvWrite>> {
        let payload = self.queue.payload(pv_name).await?;
        Ok(payload.and_then(|p| self.verified(&p, pv_name, claim_uid).ok()))
    }

    async fn queued_state(&self, pv_name: &str, claim_uid: &str) -> Effect<QueuedState> {
        let Some(payload) = self.queue.payload(pv_name).await? else {
            return Ok(QueuedState::No);
        };
        if let Some(dead) = self.queue.dead_letter_of(pv_name).await? {
            return Ok(QueuedState::Stalled {
                kind: "dead_lettered",
                reason: format!(
                    "pv-writer dead-lettered the PV write queued for this claim: {}",
                    dead.reason
                ),
            });
        }
        Ok(match self.verified(&payload, pv_name, claim_uid) {
            Ok(_) => QueuedState::Yes,
            Err(e) => QueuedState::Stalled {
                kind: "unverifiable",
                reason: format!(
                    "the PV write queued under {pv_name} is not one this provisioner made for this claim ({e}); pv-writer will refuse it"
                ),
            },
        })
    }

    async fn enqueue(&self, entry: &QueuedPvWrite) -> Effect<()> {
        let mut entry = entry.clone();
        match &self.key {
            Some(key) => key.sign(&self.provisioner_name, &mut entry),
            None => entry.mac = None,
        }
        self.queue.enqueue(&entry).await?;
        Ok(())
    }
}

#[async_trait]
impl IntentLog for IntentStore {
    async fn record(
        &self,
        intent: &ProvisionIntent,
        claim: &PersistentVolumeClaim,
        in_background: Option<bool>,
    ) -> Effect<()> {
        let in_background = match in_background {
            Some(flag) => flag,
            // Unreadable: overwritten (not in background).
            None => IntentLog::entry(self, &intent.pv_name)
                .await
                .is_ok_and(|e| e.is_some_and(|e| is_in_background(&e))),
        };
        self.record_with_claim(intent, claim, in_background).await?;
        Ok(())
    }

    async fn clear(&self, pv_name: &str) -> Effect<()> {
        IntentStore::clear(self, pv_name).await?;
        Ok(())
    }

    async fn entry(&self, pv_name: &str) -> Effect<Option<IntentEntry>> {
        Ok(IntentStore::entry(self, pv_name).await?)
    }

    async fn list(&self) -> Effect<(Vec<IntentEntry>, usize)> {
        let stored = self.count().await?;
        Ok((self.list_with_claims().await?, stored))
    }
}

/// How many events are published concurrently by [`KubeCluster`].
pub const EVENT_PUBLISHERS: usize = 16;

/// An event waiting for the publisher, with the claim's reference (not a copy of the claim).
type PendingEvent = (ObjectReference, Event);

/// [`ClusterApi`] over the Kubernetes API; events go to a background
/// publisher ([`EVENT_PUBLISHERS`] at a time), drained when the last clone is
/// dropped, so provisioning never waits for the event rate limit.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
    events: mpsc::UnboundedSender<PendingEvent>,
}

impl KubeCluster {
    /// A cluster API reporting events as `component`/`instance`, and the publisher to run
    /// beside it, which returns once every clone is dropped and all events are published.
    pub fn new(
        client: Client,
        component: &str,
        instance: &str,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let sink = EventSink::new(client.clone(), component, instance);
        let (tx, rx) = mpsc::unbounded::<PendingEvent>();
        let publisher = rx.for_each_concurrent(EVENT_PUBLISHERS, move |e| {
            let sink = sink.clone();
            async move { sink.publish(&e.0, e.1).await }
        });
        (Self { client, events: tx }, publisher)
    }

    /// GET the cluster-scoped object `name`: `Ok(None)` on 404.
    async fn get<K>(&self, name: &str) -> Effect<Option<K>>
    where
        K: Resource<Scope = ClusterResourceScope, DynamicType = ()>,
        K: Clone + DeserializeOwned + std::fmt::Debug,
    {
        if name.is_empty() {
            return Err(EffectError::EmptyName);
        }
        let call = format!("get {} {name:?}", K::kind(&()));
        Api::<K>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(kube_failed(call))
    }
}

#[async_trait]
impl ClusterApi for KubeCluster {
    async fn get_node(&self, name: &str) -> Effect<Option<Node>> {
        self.get(name).await
    }

    async fn get_pv(&self, name: &str) -> Effect<Option<PersistentVolume>> {
        self.get(name).await
    }

    async fn list_pvs(&self) -> Effect<Vec<PersistentVolume>> {
        let pvs = Api::<PersistentVolume>::all(self.client.clone());
        let list = common::kube::list::list_all(&pvs).await;
        list.map_err(kube_failed("list PersistentVolume".into()))
    }

    async fn patch_pv(&self, name: &str, patch: &serde_json::Value) -> Effect<()> {
        Api::<PersistentVolume>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(kube_failed(format!("patch PersistentVolume {name:?}")))
    }

    async fn patch_claim_status(
        &self,
        claim: &PersistentVolumeClaim,
        patch: &serde_json::Value,
    ) -> Effect<()> {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(kube_failed(format!(
                "patch PersistentVolumeClaim \"{namespace}/{name}\" status"
            )))
    }

    async fn claim_exists(&self, namespace: &str, name: &str, uid: &str) -> Effect<bool> {
        let params = ListParams::default().fields(&format!("metadata.name={name}"));
        let claims = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        let call = format!("list PersistentVolumeClaim {namespace}/{name}");
        let list = claims
            .list_metadata(&params)
            .await
            .map_err(kube_failed(call))?;
        Ok(list.items.iter().any(|c| c.uid().as_deref() == Some(uid)))
    }

    async fn remove_selected_node(&self, claim: &PersistentVolumeClaim) -> Effect<()> {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let mut metadata = serde_json::json!({"annotations": {ANN_SELECTED_NODE: null}});
        if let Some(rv) = claim.metadata.resource_version.as_deref() {
            metadata["resourceVersion"] = serde_json::Value::from(rv);
        }
        let patch = serde_json::json!({ "metadata": metadata });
        match Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::info!(claim = %format!("{namespace}/{name}"), "claim changed since it was read; its selected node is left to the next sync");
                Ok(())
            }
            Err(e) => Err(kube_failed(format!(
                "delete annotation {ANN_SELECTED_NODE:?} for PersistentVolumeClaim \"{namespace}/{name}\""
            ))(e)),
        }
    }

    fn claim_event(
        &self,
        claim: &PersistentVolumeClaim,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let action = match reason {
            reason::PROVISIONING => "Provision",
            reason::RESIZING | reason::VOLUME_RESIZE_SUCCESSFUL | reason::VOLUME_RESIZE_FAILED => {
                "Resize"
            }
            _ => "ProvisionFailed",
        };
        let claim = common::kube::events::reference(claim);
        let event = event(warning, reason, action, note);
        let _ = self.events.unbounded_send((claim, event));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Request, Response};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::client::Body;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn cluster() -> (KubeCluster, Handle) {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "default");
        let (cluster, _publisher) = KubeCluster::new(client, "provision-svc", "test");
        (cluster, handle)
    }

    fn json_response(status: u16, body: serde_json::Value) -> Response<Body> {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    }

    /// The next request the client sends, and where to answer it.
    async fn next(
        handle: &mut Handle,
    ) -> (
        Request<Body>,
        tower_test::mock::SendResponse<Response<Body>>,
    ) {
        handle.next_request().await.expect("a request")
    }

    /// A `Status` failure response: `code`, `reason`, `message`.
    fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
        let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": message, "reason": reason, "code": code});
        json_response(code, body)
    }

    #[tokio::test]
    async fn node_lookup_maps_404_to_none_and_other_errors_to_err() {
        let (cluster, mut handle) = cluster();
        let server = tokio::spawn(async move {
            let (req, send) = next(&mut handle).await;
            assert_eq!(
                (req.method(), req.uri().path()),
                (&Method::GET, "/api/v1/nodes/gone")
            );
            send.send_response(status(404, "NotFound", "nodes \"gone\" not found"));
            let (req, send) = next(&mut handle).await;
            assert_eq!(req.uri().path(), "/api/v1/nodes/n1");
            send.send_response(json_response(
                200,
                serde_json::json!({
                "kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1"}}),
            ));
            let (_, send) = next(&mut handle).await;
            send.send_response(status(500, "InternalError", "etcd down"));
        });
        assert!(cluster.get_node("gone").await.unwrap().is_none());
        let node = cluster.get_node("n1").await.unwrap().unwrap();
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        let err = cluster.get_node("n2").await.unwrap_err().to_string();
        assert!(err.starts_with("get Node \"n2\": "), "{err}");
        assert!(err.contains("etcd down"), "{err}");
        assert!(matches!(
            cluster.get_node("").await,
            Err(EffectError::EmptyName)
        ));
        server.await.unwrap();
    }

    #[tokio::test]
    async fn reschedule_is_a_conditional_merge_patch_and_a_conflict_is_done() {
        let (cluster, mut handle) = cluster();
        let server = tokio::spawn(async move {
            let (req, send) = next(&mut handle).await;
            assert_eq!(req.method(), Method::PATCH);
            assert_eq!(
                req.uri().path(),
                "/api/v1/namespaces/ns/persistentvolumeclaims/data"
            );
            assert_eq!(
                req.headers().get("content-type").unwrap(),
                "application/merge-patch+json"
            );
            let body = req.into_body().collect_bytes().await.unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                body,
                serde_json::json!({"metadata": {
                    "resourceVersion": "42",
                    "annotations": {"volume.kubernetes.io/selected-node": null}}})
            );
            send.send_response(json_response(
                200,
                serde_json::json!({
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "metadata": {"name": "data", "namespace": "ns"}}),
            ));
            // The claim changed since (re-scheduled): 409 Conflict.
            let (_, send) = next(&mut handle).await;
            send.send_response(status(409, "Conflict", "the object has been modified"));
            let (_, send) = next(&mut handle).await;
            send.send_response(status(500, "InternalError", "etcd down"));
        });
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("data".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        cluster.remove_selected_node(&claim).await.unwrap();
        assert!(
            cluster.remove_selected_node(&claim).await.is_ok(),
            "a conflict means the claim changed: done for this attempt"
        );
        let err = cluster
            .remove_selected_node(&claim)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("delete annotation \"volume.kubernetes.io/selected-node\" for PersistentVolumeClaim \"ns/data\": "), "{err}");
        assert!(err.contains("etcd down"), "{err}");
        server.await.unwrap();
    }
}
