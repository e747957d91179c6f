//! Building blocks of the `bench` program (`tests/src/bin/bench.rs`): the
//! load it offers ([`load`]), what it observes through its own watches
//! ([`observe`]), the API requests the services made according to the control
//! plane ([`cost`]), the controller-manager-alone rates ([`kcm`]) and the
//! API-server outage measurement ([`outage`]).

pub mod cost;
pub mod kcm;
pub mod load;
pub mod observe;
pub mod outage;
