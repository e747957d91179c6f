//! Building blocks of the `bench` program (`tests/src/bin/bench.rs`): the
//! load it offers ([`load`]), what it observes through its own watches
//! ([`observe`]), the API requests the services made according to the control
//! plane ([`cost`]), the controller-manager-alone rates ([`kcm`]) and the
//! API-server outage measurement ([`outage`]); one burst and its reclaim
//! timed the same way for the services and for a reference provisioner
//! ([`burst`], [`reference`]), and who the burst's CPU went to ([`cpu`]).

pub mod burst;
pub mod cost;
pub mod cpu;
pub mod kcm;
pub mod load;
pub mod observe;
pub mod outage;
pub mod peer;
pub mod reference;
