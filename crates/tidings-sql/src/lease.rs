//! Membership and partition leases, timed by the database's clock so that
//! members on different hosts agree on expiry.

use std::time::Duration;

use async_trait::async_trait;
use tidings_core::{Lease, LeaseStore, Result};

use crate::db::Stmt;
use crate::errors::db_error;
use crate::store::millis;
use crate::{Dialect, SqlStore};

fn partitions<D: Dialect>(p: &[u32]) -> D::IntList {
    D::int_list(&p.iter().map(|&p| i64::from(p)).collect::<Vec<_>>())
}

#[async_trait]
impl<D: Dialect> LeaseStore for SqlStore<D> {
    async fn heartbeat(&self, scope: &str, member: &str, ttl: Duration) -> Result<Vec<String>> {
        let mut tx = self.begin_tx("renewing membership").await?;
        Stmt::<D>::new(D::SQL.heartbeat, "renewing membership")
            .bind(scope)
            .bind(member)
            .bind(millis(ttl))
            .execute(&mut tx)
            .await?;
        Stmt::<D>::new(D::SQL.forget_expired_members, "forgetting expired members")
            .bind(scope)
            .execute(&mut tx)
            .await?;
        let members = Stmt::<D>::new(D::SQL.members, "listing members")
            .bind(scope)
            .fetch_all(&mut tx)
            .await?
            .iter()
            .map(|r| r.get::<String>(0))
            .collect::<Result<Vec<_>>>()?;
        tx.commit().await.map_err(db_error::<D>("renewing membership"))?;
        Ok(members)
    }

    async fn acquire(&self, scope: &str, member: &str, wanted: &[u32], ttl: Duration) -> Result<Vec<Lease>> {
        // A row is taken if it is ours or lapsed; the fence grows unless it
        // was ours and still live. Released rows stay (lapsed), keeping the
        // fence growing.
        let list = partitions::<D>(wanted);
        let acquire = Stmt::<D>::new(D::SQL.acquire_leases, "acquiring leases")
            .bind(scope)
            .bind(member)
            .bind(list.clone())
            .bind(millis(ttl));
        let rows = match D::SQL.held_leases {
            None => {
                let mut conn = self.conn("acquiring leases").await?;
                acquire.fetch_all(&mut conn).await?
            }
            // The rows it took stay locked until the read: what it reads is what it holds.
            Some(held) => {
                let mut tx = self.begin_tx("acquiring leases").await?;
                acquire.execute(&mut tx).await?;
                let rows = Stmt::<D>::new(held, "reading the leases held")
                    .bind(scope)
                    .bind(member)
                    .bind(list)
                    .fetch_all(&mut tx)
                    .await?;
                tx.commit().await.map_err(db_error::<D>("acquiring leases"))?;
                rows
            }
        };
        let mut leases = rows
            .iter()
            .map(|r| {
                Ok(Lease {
                    partition: r.get::<i32>(0)?.max(0) as u32,
                    fence: r.get(1)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        leases.sort();
        Ok(leases)
    }

    async fn release(&self, scope: &str, member: &str, wanted: &[u32]) -> Result<()> {
        let mut conn = self.conn("releasing leases").await?;
        Stmt::<D>::new(D::SQL.release_leases, "releasing leases")
            .bind(scope)
            .bind(member)
            .bind(partitions::<D>(wanted))
            .execute(&mut conn)
            .await?;
        Ok(())
    }

    async fn leave(&self, scope: &str, member: &str) -> Result<()> {
        let mut tx = self.begin_tx("leaving").await?;
        Stmt::<D>::new(D::SQL.release_all_leases, "releasing leases")
            .bind(scope)
            .bind(member)
            .execute(&mut tx)
            .await?;
        Stmt::<D>::new(D::SQL.leave, "leaving")
            .bind(scope)
            .bind(member)
            .execute(&mut tx)
            .await?;
        tx.commit().await.map_err(db_error::<D>("leaving"))
    }
}
