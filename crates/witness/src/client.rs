//! The tokio side: one short HTTP connection per call, endpoints tried in order, every call
//! bounded by the timeout.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::gateway::{self, KeyValue, TxnResult};
use crate::http::{self, ResponseReader};
use crate::record::{self, NodeId};
use crate::Error;
use replication::epoch::{in_sync_proposal, race_proposal};
use replication::{EpochRecord, RaceOutcome};

/// Where the witness is and who asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessConfig {
    /// etcd client URLs' addresses (`http://` only).
    pub endpoints: Vec<SocketAddr>,
    /// The cluster's epoch key, e.g. `/lanes/<cluster>/epoch`.
    pub key: String,
    /// This node, 0 or 1.
    pub node: NodeId,
    /// Limit for one call on one endpoint (connect, send, answer).
    pub timeout: Duration,
}

/// The record with the revision it was read at (0: nothing stored yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versioned {
    pub record: EpochRecord,
    pub revision: i64,
}

/// How often a race or an in-sync mark re-reads after losing a compare to a concurrent write.
const CAS_TRIES: usize = 8;

/// The etcd-backed witness of one cluster, as seen by one node.
#[derive(Debug, Clone)]
pub struct Witness {
    config: WitnessConfig,
}

impl Witness {
    pub fn new(config: WitnessConfig) -> Self {
        Self { config }
    }

    pub fn node(&self) -> NodeId {
        self.config.node
    }

    /// The current record; a cluster that has none gets the core's first record (epoch 0,
    /// nobody alone), created once, whoever asks first.
    pub async fn read(&self) -> Result<Versioned, Error> {
        let body = self
            .call(gateway::RANGE, gateway::range(&self.config.key))
            .await?;
        let current = gateway::parse_range(&body).map_err(|r| self.protocol(r))?;
        match current {
            Some(kv) => self.decode(&kv),
            None => {
                let none = Versioned {
                    record: EpochRecord::default(),
                    revision: 0,
                };
                match self.put_if(&none, &EpochRecord::default()).await? {
                    Ok(v) | Err(v) => Ok(v),
                }
            }
        }
    }

    /// Races for the epoch (the core's `Action::RaceForEpoch`): won when this node's proposal
    /// is stored, lost when the record says it is outdated, unreachable when etcd does not
    /// answer (nothing may be assumed then).
    pub async fn race(&self) -> RaceOutcome {
        match self.race_inner().await {
            Ok(outcome) => outcome,
            Err(_) => RaceOutcome::Unreachable,
        }
    }

    /// [`Witness::race`] with the reason etcd could not be used.
    pub async fn race_inner(&self) -> Result<RaceOutcome, Error> {
        let mut seen = self.read().await?;
        for _ in 0..CAS_TRIES {
            let Some(next) = race_proposal(&seen.record, self.config.node) else {
                return Ok(RaceOutcome::Lost {
                    epoch: seen.record.epoch,
                });
            };
            match self.put_if(&seen, &next).await? {
                Ok(won) => {
                    return Ok(RaceOutcome::Won {
                        epoch: won.record.epoch,
                    })
                }
                Err(current) => seen = current,
            }
        }
        Err(self.protocol(format!(
            "the epoch key changed under {CAS_TRIES} compare-and-swaps in a row"
        )))
    }

    /// Clears the outdated mark after a finished resync in `epoch` (the core's
    /// `Action::MarkInSync`): true once the record needs no change, false if etcd did not
    /// answer.
    pub async fn mark_in_sync(&self, epoch: u64) -> Result<bool, Error> {
        let mut seen = self.read().await?;
        for _ in 0..CAS_TRIES {
            let Some(next) = in_sync_proposal(&seen.record, self.config.node, epoch) else {
                return Ok(true);
            };
            match self.put_if(&seen, &next).await? {
                Ok(_) => return Ok(true),
                Err(current) => seen = current,
            }
        }
        Ok(false)
    }

    /// Stores `next` if the key is still at `seen`'s revision: `Ok` with what was stored, or
    /// `Err` with the record that is there instead.
    pub async fn put_if(
        &self,
        seen: &Versioned,
        next: &EpochRecord,
    ) -> Result<Result<Versioned, Versioned>, Error> {
        let body =
            gateway::put_if_revision(&self.config.key, seen.revision, &record::to_json(next));
        let answer = self.call(gateway::TXN, body).await?;
        match gateway::parse_txn(&answer).map_err(|r| self.protocol(r))? {
            TxnResult::Applied { revision } => Ok(Ok(Versioned {
                record: *next,
                revision,
            })),
            TxnResult::Failed { current: Some(kv) } => Ok(Err(self.decode(&kv)?)),
            TxnResult::Failed { current: None } => {
                Err(self.protocol("the compare failed but the key does not exist".to_string()))
            }
        }
    }

    fn decode(&self, kv: &KeyValue) -> Result<Versioned, Error> {
        let record = record::from_json(&kv.value).map_err(|reason| Error::Record {
            key: self.config.key.clone(),
            reason,
        })?;
        Ok(Versioned {
            record,
            revision: kv.mod_revision,
        })
    }

    fn protocol(&self, reason: String) -> Error {
        Error::Protocol {
            endpoint: self.endpoints(),
            reason,
        }
    }

    fn endpoints(&self) -> String {
        self.config
            .endpoints
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One call: each endpoint in turn until one answers 200.
    async fn call(&self, path: &str, body: Vec<u8>) -> Result<Vec<u8>, Error> {
        let mut reasons = Vec::new();
        for endpoint in &self.config.endpoints {
            let request = http::post(&endpoint.to_string(), path, &body);
            match tokio::time::timeout(self.config.timeout, exchange(*endpoint, &request)).await {
                Ok(Ok(response)) if response.status == 200 => return Ok(response.body),
                Ok(Ok(response)) => reasons.push(format!(
                    "{endpoint}: HTTP {} {}",
                    response.status,
                    String::from_utf8_lossy(&response.body).trim()
                )),
                Ok(Err(e)) => reasons.push(format!("{endpoint}: {e}")),
                Err(_) => reasons.push(format!(
                    "{endpoint}: no answer within {} ms",
                    self.config.timeout.as_millis()
                )),
            }
        }
        Err(Error::Unreachable {
            endpoints: self.endpoints(),
            reason: reasons.join("; "),
        })
    }
}

async fn exchange(endpoint: SocketAddr, request: &[u8]) -> Result<http::Response, String> {
    let mut stream = TcpStream::connect(endpoint)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut reader = ResponseReader::default();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("receive: {e}"))?;
        reader.feed(&buf[..n]).map_err(|e| e.to_string())?;
        if let Some(response) = reader.response(n == 0).map_err(|e| e.to_string())? {
            return Ok(response);
        }
    }
}
