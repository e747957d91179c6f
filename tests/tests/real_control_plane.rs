//! The real-control-plane harness itself (`e2e::realkube`): etcd +
//! kube-apiserver + kube-controller-manager of each release (v1.19.2, v1.37.2 with
//! kube-scheduler) started from the binaries `Assets::locate` finds. Each test is
//! skipped with one line when the binaries are missing, and fails instead under `CI=true`.
//!
//! Run: `cargo test -p e2e --test real_control_plane` (`-- v1_37` for one release).

use std::time::Duration;

use e2e::harness::wait_for;
use e2e::realkube::{Assets, RealCluster, RealClusterOptions};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::json;

fn obj<T: DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

async fn sa_client(cluster: &RealCluster, ns: &str, name: &str) -> kube::Client {
    let path = cluster.service_account_kubeconfig(ns, name).await.unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Two clusters at once, on different ports, each serving its admin client;
/// a Node can be created (there is no kubelet) and is seen only in its own cluster.
async fn two_clusters_start_and_serve_the_admin_client(assets: Assets) {
    let started = std::time::Instant::now();
    let (a, b) = tokio::join!(
        RealCluster::start(&assets, RealClusterOptions::default()),
        RealCluster::start(&assets, RealClusterOptions::default()),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    eprintln!("two clusters ready after {:?}", started.elapsed());
    assert_ne!(a.server_url(), b.server_url());
    assert_ne!(a.root(), b.root());

    for c in [&a, &b] {
        let names: Vec<String> = Api::<Namespace>::all(c.client())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        for want in ["default", "kube-system", "kube-public"] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing in {names:?}"
            );
        }
    }

    let node: Node = obj(json!({
        "metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}}
    }));
    Api::<Node>::all(a.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let got = Api::<Node>::all(a.client()).get("node-a").await.unwrap();
    assert_eq!(
        got.metadata.labels.unwrap()["kubernetes.io/hostname"],
        "node-a"
    );
    assert!(Api::<Node>::all(b.client())
        .get_opt("node-a")
        .await
        .unwrap()
        .is_none());

    // The admin kubeconfig on disk works as well as the in-memory client.
    let kc = kube::config::Kubeconfig::read_from(a.admin_kubeconfig()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        cfg.cluster_url.to_string().trim_end_matches('/'),
        a.server_url()
    );
    let from_file = kube::Client::try_from(cfg).unwrap();
    assert!(Api::<Node>::all(from_file)
        .get_opt("node-a")
        .await
        .unwrap()
        .is_some());

    // Drop stops everything and removes the directory.
    let (root, url) = (a.root().to_path_buf(), a.server_url());
    drop(a);
    assert!(!root.exists(), "{} left behind", root.display());
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "API server still listening after drop"
    );
}

/// A fresh ServiceAccount is refused (403) until a ClusterRole and binding
/// grant it, and the audit log records its requests with verb, resource and code.
async fn rbac_is_enforced_and_audited_per_identity(assets: Assets) {
    let cluster = RealCluster::start(&assets, RealClusterOptions::default())
        .await
        .unwrap();
    let sa = sa_client(&cluster, "rbac-test", "reader").await;
    let pvs: Api<PersistentVolume> = Api::all(sa.clone());
    let err = pvs.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(status_code(&err), Some(403), "{err}");

    let admin = cluster.client();
    let role: ClusterRole = obj(json!({
        "metadata": {"name": "pv-reader"},
        "rules": [{"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list"]}]
    }));
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: ClusterRoleBinding = obj(json!({
        "metadata": {"name": "pv-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pv-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "rbac-test"}]
    }));
    Api::<ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // The RBAC authorizer reads roles through an informer: allow it a moment.
    wait_for(Duration::from_secs(20), "the grant to take effect", || {
        let pvs = pvs.clone();
        async move { pvs.list(&ListParams::default()).await.ok() }
    })
    .await
    .unwrap();
    // Still nothing beyond the grant: creating a PV is forbidden.
    let pv: PersistentVolume = obj(json!({
        "metadata": {"name": "pv-x"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "hostPath": {"path": "/tmp/pv-x"}}
    }));
    let err = pvs.create(&PostParams::default(), &pv).await.unwrap_err();
    assert_eq!(status_code(&err), Some(403), "{err}");

    // A granted verb on a missing object is a 404; a subresource needs its own grant.
    let err = pvs.get("pv-x").await.unwrap_err();
    assert_eq!(status_code(&err), Some(404), "{err}");
    let err = pvs.get_status("pv-x").await.unwrap_err();
    assert_eq!(status_code(&err), Some(403), "{err}");

    let user = "system:serviceaccount:rbac-test:reader";
    let recs = cluster.audit_records().unwrap();
    let mine: Vec<_> = recs.iter().filter(|r| r.user == user).collect();
    let pv_calls = |verb: &str, code: u16| {
        mine.iter()
            .filter(|r| {
                r.verb == verb
                    && r.api_group.is_empty()
                    && r.resource == "persistentvolumes"
                    && r.subresource.is_none()
                    && r.namespace.is_none()
                    && r.code == Some(code)
            })
            .count()
    };
    assert!(pv_calls("list", 403) >= 1, "no refused list in {mine:#?}");
    assert!(pv_calls("list", 200) >= 1, "no granted list in {mine:#?}");
    assert_eq!(pv_calls("create", 403), 1, "{mine:#?}");
    assert!(
        mine.iter().any(|r| r.verb == "get"
            && r.name.as_deref() == Some("pv-x")
            && r.subresource.is_none()
            && r.code == Some(404)),
        "{mine:#?}"
    );
    assert!(
        mine.iter().any(|r| r.verb == "get"
            && r.name.as_deref() == Some("pv-x")
            && r.subresource.as_deref() == Some("status")
            && r.code == Some(403)),
        "{mine:#?}"
    );
    // Everything this identity did was on persistentvolumes (no other calls were made with it).
    assert!(
        mine.iter().all(|r| r.resource == "persistentvolumes"),
        "{mine:#?}"
    );
    // The admin's creations are recorded under the admin's name.
    assert!(recs.iter().any(|r| r.user == "admin"
        && r.verb == "create"
        && r.api_group == "rbac.authorization.k8s.io"
        && r.resource == "clusterrolebindings"
        && r.code == Some(201)));
}

/// `stop_apiserver` is a real outage (connection errors, not HTTP errors);
/// after `start_apiserver` the same URL serves again, objects are still there
/// and the controller manager still works.
async fn apiserver_outage_and_restart_keep_objects(assets: Assets) {
    let mut cluster = RealCluster::start(&assets, RealClusterOptions::default())
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let cm: ConfigMap = obj(json!({"metadata": {"name": "before-outage"}, "data": {"k": "v"}}));
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let url = cluster.server_url();

    cluster.stop_apiserver().await.unwrap();
    let res = tokio::time::timeout(Duration::from_secs(30), cms.get("before-outage"))
        .await
        .expect("a request during the outage fails promptly");
    let err = res.unwrap_err();
    assert_eq!(
        status_code(&err),
        None,
        "expected a connection error, got {err}"
    );

    cluster.start_apiserver().await.unwrap();
    assert_eq!(cluster.server_url(), url);
    let got = cms.get("before-outage").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");
    // The controller manager lived through the outage: its token controller
    // still issues a token for a ServiceAccount created afterwards.
    let kubeconfig = cluster
        .service_account_kubeconfig("after-outage", "sa")
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.log_tail(20)));
    assert!(kubeconfig.starts_with(cluster.root()));
    // Stopping twice and starting twice are no-ops.
    cluster.stop_apiserver().await.unwrap();
    cluster.stop_apiserver().await.unwrap();
    cluster.start_apiserver().await.unwrap();
    cluster.start_apiserver().await.unwrap();
    assert!(cms.get_opt("before-outage").await.unwrap().is_some());
}

/// The controller manager's PV binder runs: a claim of a class with an external
/// provisioner gets `volume.beta.kubernetes.io/storage-provisioner`.
async fn pv_binder_annotates_claims_for_external_provisioners(assets: Assets) {
    let started = std::time::Instant::now();
    let cluster = RealCluster::start(&assets, RealClusterOptions::default())
        .await
        .unwrap();
    eprintln!("cluster ready after {:?}", started.elapsed());
    let client = cluster.client();
    let sc: StorageClass = obj(json!({
        "metadata": {"name": "external"},
        "provisioner": "example.com/hostpath",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate"
    }));
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &sc)
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let pvc: PersistentVolumeClaim = obj(json!({
        "metadata": {"name": "data"},
        "spec": {"storageClassName": "external", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}
    }));
    claims.create(&PostParams::default(), &pvc).await.unwrap();
    let provisioner = wait_for(
        Duration::from_secs(60),
        "the storage-provisioner annotation on claim default/data",
        || {
            let claims = claims.clone();
            async move {
                let c = claims.get("data").await.ok()?;
                c.metadata
                    .annotations?
                    .get("volume.beta.kubernetes.io/storage-provisioner")
                    .cloned()
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.log_tail(20)));
    assert_eq!(provisioner, "example.com/hostpath");
    let c = claims.get("data").await.unwrap();
    assert_eq!(c.status.unwrap().phase.as_deref(), Some("Pending"));
    // pvc-protection added its finalizer.
    assert!(c
        .metadata
        .finalizers
        .unwrap_or_default()
        .iter()
        .any(|f| f == "kubernetes.io/pvc-protection"));
}

e2e::on_each_version!(
    two_clusters_start_and_serve_the_admin_client,
    rbac_is_enforced_and_audited_per_identity,
    apiserver_outage_and_restart_keep_objects,
    pv_binder_annotates_claims_for_external_provisioners,
);
