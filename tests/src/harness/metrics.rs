//! Scraping a service's Prometheus `/metrics` over plain HTTP and reading
//! sample values from the text exposition format.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET http://<addr><path>`; returns (status code, body). 2 s timeout.
///
/// Errors: connection refused, timeout, or a malformed response.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        anyhow::Ok(String::from_utf8_lossy(&out).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .with_context(|| format!("GET {addr}{path} timed out"))??;
    let status: u16 = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("malformed HTTP response from {addr}{path}"))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One scrape of a `/metrics` page.
#[derive(Debug, Clone, Default)]
pub struct MetricsPage {
    /// The raw text exposition.
    pub text: String,
}

impl MetricsPage {
    /// Scrape `http://<addr>/metrics`.
    ///
    /// Errors: see [`http_get`]; a non-200 answer.
    pub async fn scrape(addr: SocketAddr) -> anyhow::Result<Self> {
        let (code, text) = http_get(addr, "/metrics").await?;
        anyhow::ensure!(code == 200, "GET {addr}/metrics answered {code}");
        Ok(Self { text })
    }

    /// Value of the sample `name` whose labels include every pair in `labels`
    /// (all of them summed when several series match); `None` if none matches.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = None;
        for line in self.text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let (metric, label_text) = match series.split_once('{') {
                Some((m, l)) => (m, l.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                continue;
            }
            let ok = labels
                .iter()
                .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
            if ok {
                if let Ok(v) = value.parse::<f64>() {
                    *found.get_or_insert(0.0) += v;
                }
            }
        }
        found
    }

    /// Sum of all series of `name` (0 when absent).
    pub fn sum(&self, name: &str) -> f64 {
        self.value(name, &[]).unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_labelled_and_plain_samples() {
        let page = MetricsPage {
            text: "# HELP x y\n# TYPE a counter\n\
                   controller_persistentvolumeclaim_provision_total{class=\"fast\"} 3\n\
                   controller_persistentvolumeclaim_provision_total{class=\"slow\"} 4\n\
                   leader_election_master_status{name=\"l\"} 1\nqueue_depth 7\n"
                .into(),
        };
        assert_eq!(
            page.value(
                "controller_persistentvolumeclaim_provision_total",
                &[("class", "slow")]
            ),
            Some(4.0)
        );
        assert_eq!(
            page.sum("controller_persistentvolumeclaim_provision_total"),
            7.0
        );
        assert_eq!(page.value("queue_depth", &[]), Some(7.0));
        assert_eq!(page.value("queue", &[]), None);
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
