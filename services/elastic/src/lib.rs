//! Elastic allocation, without IO: the time-windowed share policies of `policies/elastic.toml`,
//! demand forecasting with a seasonal model (Holt-Winters), and what each scheduling pass
//! under `--elastic` asks of the live cluster (`live`). What sharing achieves is measured on
//! the real system by `allot bench efficiency`, not modelled here.

pub mod forecast;
pub mod live;
pub mod policy;

pub use forecast::{HoltWinters, mape};
pub use policy::{ElasticPolicy, PolicyError};
