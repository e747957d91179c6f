//! Kubernetes API request metrics under client-go's names, as a tower layer on
//! the kube client's stack: `rest_client_requests_total{code, method}` (`"<error>"`
//! when no response arrived) and `rest_client_request_duration_seconds{verb}` (to
//! the response head), each outcome told to the [`ApiReachability`] log. Inside the rate
//! limit, so limiter waits are not in the latency: docs/decisions/0005-events-and-client-go-metrics.md.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus::{HistogramVec, IntCounterVec, Registry};

use crate::runtime::api_reachability::ApiReachability;

/// The two request families and the reachability log; cheap to clone (shared counters).
/// Use it as a [`tower::Layer`].
#[derive(Clone)]
pub struct ApiMetrics {
    requests_total: IntCounterVec,
    duration_seconds: HistogramVec,
    reach: ApiReachability,
}

impl ApiMetrics {
    /// Create both families in `registry`, logging the reachability of `server` (its URL).
    /// Panics when they are already registered there (a programming error).
    pub fn register(registry: &Registry, server: &str) -> Self {
        use crate::runtime::metrics::{counter_vec, histogram_vec};
        Self {
            requests_total: counter_vec(
                registry,
                "rest_client_requests_total",
                "Number of HTTP requests to the Kubernetes API server, partitioned by status code and method.",
                &["code", "method"],
            ),
            duration_seconds: histogram_vec(
                registry,
                "rest_client_request_duration_seconds",
                "Request latency in seconds to the Kubernetes API server (to the response head), by verb.",
                &["verb"],
            ),
            reach: ApiReachability::new(server),
        }
    }
}

impl<S> tower::Layer<S> for ApiMetrics {
    type Service = ApiMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiMetricsService {
            inner,
            metrics: self.clone(),
        }
    }
}

/// The service [`ApiMetrics`] wraps around the kube client's stack.
#[derive(Clone)]
pub struct ApiMetricsService<S> {
    inner: S,
    metrics: ApiMetrics,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for ApiMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let method = req.method().as_str().to_owned();
        let metrics = self.metrics.clone();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await.map_err(Into::into);
            let code = match &result {
                Ok(resp) => {
                    metrics.reach.answered();
                    resp.status().as_str().to_owned()
                }
                Err(e) => {
                    metrics.reach.failed(&**e);
                    "<error>".to_owned()
                }
            };
            let seconds = start.elapsed().as_secs_f64();
            let (requests, duration) = (&metrics.requests_total, &metrics.duration_seconds);
            requests.with_label_values(&[&code, &method]).inc();
            duration.with_label_values(&[&method]).observe(seconds);
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test]
    async fn counts_by_code_and_method_and_times_by_verb() {
        let registry = Registry::new();
        let metrics = ApiMetrics::register(&registry, "https://10.0.0.1:6443");
        let mut svc = metrics.layer(tower::service_fn(|req: http::Request<()>| async move {
            if req.uri().path() == "/fail" {
                return Err(tower::BoxError::from("connection refused"));
            }
            let status = if req.method() == http::Method::POST {
                409
            } else {
                200
            };
            Ok(http::Response::builder().status(status).body(()).unwrap())
        }));
        for (method, path) in [
            ("GET", "/a"),
            ("GET", "/b"),
            ("POST", "/c"),
            ("GET", "/fail"),
        ] {
            let req = http::Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap();
            let _ = svc.ready().await.unwrap().call(req).await;
        }
        let text = crate::runtime::metrics::render(&registry);
        for line in [
            "rest_client_requests_total{code=\"200\",method=\"GET\"} 2\n",
            "rest_client_requests_total{code=\"409\",method=\"POST\"} 1\n",
            "rest_client_requests_total{code=\"<error>\",method=\"GET\"} 1\n",
            "rest_client_request_duration_seconds_count{verb=\"GET\"} 3\n",
            "rest_client_request_duration_seconds_count{verb=\"POST\"} 1\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
