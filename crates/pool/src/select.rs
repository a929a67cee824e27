//! TEMPORARY: replaced by the selection module.
use memlend_wire::ctrl::NodeId;
pub struct Candidate {
    pub node: NodeId,
    pub available_bytes: u64,
    pub rtt_us: Option<u32>,
    pub arrival_order: u64,
}
pub trait Selector {
    fn pick(&mut self, candidates: &[Candidate]) -> Option<usize>;
    fn clone_box(&self) -> Box<dyn Selector + Send>;
}
#[derive(Clone)]
pub struct FirstCome;
impl Selector for FirstCome {
    fn clone_box(&self) -> Box<dyn Selector + Send> {
        Box::new(self.clone())
    }
    fn pick(&mut self, c: &[Candidate]) -> Option<usize> {
        (0..c.len()).min_by_key(|&i| c[i].arrival_order)
    }
}
