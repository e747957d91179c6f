//! Live lists in pages, as client-go's pager reads them: a large list never comes back
//! as one response.

use std::fmt::Debug;

use k8s_openapi::serde::de::DeserializeOwned;
use kube::api::{Api, ListParams};

/// Objects per page (client-go's pager default).
pub const PAGE_SIZE: u32 = 500;

/// Every object `api` lists, read live (never a cache) in pages of [`PAGE_SIZE`]; when a
/// continue token expires (410), one unpaged list, as client-go's pager. Errors: a failed page.
pub async fn list_all<K>(api: &Api<K>) -> kube::Result<Vec<K>>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(PAGE_SIZE);
    loop {
        let page = match api.list(&params).await {
            Err(kube::Error::Api(status))
                if status.code == 410 && params.continue_token.is_some() =>
            {
                return Ok(api.list(&ListParams::default()).await?.items);
            }
            page => page?,
        };
        items.extend(page.items);
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube::client::Body;
    use kube::Client;

    /// A list response of PVs `names` with continue token `next` ("" for the last page).
    fn page(names: &[&str], next: &str) -> Response<Body> {
        let items: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({"metadata": {"name": n}}))
            .collect();
        let body = serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolumeList",
            "metadata": {"continue": next, "resourceVersion": "7"}, "items": items,
        });
        Response::new(Body::from(serde_json::to_vec(&body).unwrap()))
    }

    fn expired() -> Response<Body> {
        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "too old", "reason": "Expired", "code": 410});
        let mut response = Response::new(Body::from(serde_json::to_vec(&status).unwrap()));
        *response.status_mut() = http::StatusCode::GONE;
        response
    }

    /// The PV names [`list_all`] returns while the server answers `answers` in turn,
    /// and the query of each request.
    async fn listed(answers: Vec<Response<Body>>) -> (kube::Result<Vec<String>>, Vec<String>) {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api = Api::<PersistentVolume>::all(Client::new(svc, "default"));
        let server = tokio::spawn(async move {
            let mut queries = Vec::new();
            for answer in answers {
                let Some((request, send)) = handle.next_request().await else {
                    break;
                };
                queries.push(request.uri().query().unwrap_or_default().to_string());
                send.send_response(answer);
            }
            queries
        });
        let pvs = list_all(&api).await;
        drop(api); // Fewer requests than scripted end the server's loop.
        let names = pvs.map(|pvs| pvs.into_iter().map(|pv| pv.metadata.name.unwrap()));
        (names.map(Iterator::collect), server.await.unwrap())
    }

    #[tokio::test]
    async fn every_page_is_read_with_its_continue_token() {
        let (names, queries) = listed(vec![page(&["a", "b"], "t1"), page(&["c"], "")]).await;
        assert_eq!(names.unwrap(), ["a", "b", "c"]);
        assert_eq!(queries, ["&limit=500", "&limit=500&continue=t1"]);
    }

    #[tokio::test]
    async fn an_expired_continue_token_falls_back_to_one_unpaged_list() {
        let answers = vec![page(&["a"], "t1"), expired(), page(&["a", "b"], "")];
        let (names, queries) = listed(answers).await;
        assert_eq!(names.unwrap(), ["a", "b"]);
        assert_eq!(queries[2], "");
        // A page may be empty and still carry a continue token.
        let (names, _) = listed(vec![page(&[], "t1"), expired(), page(&["a"], "")]).await;
        assert_eq!(names.unwrap(), ["a"]);
    }

    #[tokio::test]
    async fn a_410_on_the_first_page_is_an_error() {
        let (names, queries) = listed(vec![expired(), page(&["a"], "")]).await;
        assert!(matches!(names, Err(kube::Error::Api(s)) if s.code == 410));
        assert_eq!(queries.len(), 1, "no second list");
    }
}
