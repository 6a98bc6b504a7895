//! [`map`]: a function over a few big independent items (the modules of an
//! attach: their analysis, their code generation) on as many threads as
//! the host has CPUs, results in the items' order. Scoped threads: the
//! work borrows freely and every thread has ended on return; each inherits
//! the calling thread's nice value.
use std::sync::Mutex;

/// `items.map(f)` on up to `available_parallelism` threads (one: in the
/// calling thread). Items are taken in order, so put the biggest first.
pub(crate) fn map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let n = items.len();
    let threads = std::thread::available_parallelism()
        .map_or(1, |c| c.get())
        .min(n);
    if threads <= 1 {
        return items.into_iter().map(f).collect();
    }
    let queue = Mutex::new(items.into_iter().enumerate());
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                    let Some((i, item)) = next else { break };
                    let r = f(item);
                    out.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                }
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item was mapped"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_keep_the_order_of_the_items() {
        let items: Vec<u64> = (0..100).collect();
        let out = super::map(items, |x| {
            // Uneven work, so that threads finish out of order.
            std::thread::sleep(std::time::Duration::from_micros((x % 7) * 100));
            x * x
        });
        assert_eq!(out, (0..100).map(|x| x * x).collect::<Vec<_>>());
        assert!(super::map(Vec::<u8>::new(), |x| x).is_empty());
    }
}
