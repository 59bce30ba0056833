//! The inference server: requests over TCP, one GPU thread, optional batching.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};

use crate::Args;
use crate::cuda::Gpu;

type Conn = Arc<Mutex<TcpStream>>;

struct Queue {
    waiting: Mutex<VecDeque<(u64, Conn)>>,
    ready: Condvar,
}

/// How long one kernel of a batch of `batch` runs.
pub fn batch_kernel_us(kernel_us: u32, batch: usize, batch_cost: f64) -> u32 {
    let factor = 1.0 + batch_cost * (batch.saturating_sub(1)) as f64;
    (f64::from(kernel_us) * factor)
        .round()
        .clamp(1.0, f64::from(u32::MAX)) as u32
}

pub fn run(args: &Args) -> Result<(), String> {
    let port_file = args.text("port-file").ok_or("--port-file is required")?;
    let listen = args.text("listen").unwrap_or("127.0.0.1:0");
    let kernels: u32 = args.num("kernels", 3)?;
    let kernel_us: u32 = args.num("kernel-us", 1000)?;
    let max_batch: usize = args.num("max-batch", 1)?;
    let batch_cost: f64 = args.num("batch-cost", 0.25)?;
    if kernels == 0 || kernel_us == 0 || max_batch == 0 || !(0.0..=1.0).contains(&batch_cost) {
        return Err(
            "--kernels, --kernel-us and --max-batch must be at least 1, --batch-cost 0 to 1".into(),
        );
    }
    let gpu = Gpu::open()?;
    let listener = TcpListener::bind(listen).map_err(|e| format!("--listen {listen}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let queue = Arc::new(Queue {
        waiting: Mutex::new(VecDeque::new()),
        ready: Condvar::new(),
    });
    {
        let queue = queue.clone();
        std::thread::spawn(move || {
            if let Err(e) = gpu.bind() {
                eprintln!("allot-workload serve: {e}");
                std::process::exit(1);
            }
            loop {
                let batch: Vec<(u64, Conn)> = {
                    let mut q = queue.waiting.lock().unwrap_or_else(|e| e.into_inner());
                    while q.is_empty() {
                        q = queue.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                    }
                    let n = q.len().min(max_batch);
                    q.drain(..n).collect()
                };
                let us = batch_kernel_us(kernel_us, batch.len(), batch_cost);
                for _ in 0..kernels {
                    if let Err(e) = gpu.kernel(us) {
                        eprintln!("allot-workload serve: {e}");
                        std::process::exit(1);
                    }
                }
                for (id, conn) in batch {
                    // A client that left gets nothing; the others are answered.
                    let _ = conn
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .write_all(&id.to_le_bytes());
                }
            }
        });
    }
    crate::write_atomic(std::path::Path::new(port_file), &format!("{port}\n"))
        .map_err(|e| format!("--port-file {port_file}: {e}"))?;
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let Ok(reader) = stream.try_clone() else {
            continue;
        };
        let conn: Conn = Arc::new(Mutex::new(stream));
        let queue = queue.clone();
        std::thread::spawn(move || read_requests(reader, &conn, &queue));
    }
    Ok(())
}

fn read_requests(mut reader: TcpStream, conn: &Conn, queue: &Queue) {
    let mut buf = [0u8; 8];
    while reader.read_exact(&mut buf).is_ok() {
        queue
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((u64::from_le_bytes(buf), conn.clone()));
        queue.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::batch_kernel_us;

    #[test]
    fn a_batch_costs_more_than_one_request_and_less_than_each_alone() {
        assert_eq!(batch_kernel_us(1000, 1, 0.25), 1000);
        assert_eq!(batch_kernel_us(1000, 4, 0.25), 1750);
        assert!(batch_kernel_us(1000, 8, 0.25) < 8 * 1000);
        assert_eq!(batch_kernel_us(1000, 8, 0.0), 1000);
    }
}
