//! What viabench needs from the operating system: CPU placement and host
//! facts for the report.

use crate::error::{Error, Result};

/// Pins every thread of this process to `cpu` (threads started later
/// inherit it).
pub fn pin_process(cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays within it for cpu < CPU_SETSIZE.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(Error::new(format!("CPU {cpu} is out of range")));
    }
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let tids: Vec<i32> =
        std::fs::read_dir("/proc/self/task")?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    for tid in tids {
        // SAFETY: a valid set for a thread of this process.
        if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
            return Err(Error::new(format!("sched_setaffinity(CPU {cpu}): {}", std::io::Error::last_os_error())));
        }
    }
    Ok(())
}

/// CPUs online.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// This host's name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer and its length.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `uname -sr`.
pub fn kernel() -> String {
    // SAFETY: utsname is plain data that uname fills.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    format!("{} {}", field(&u.sysname), field(&u.release))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_facts_are_there() {
        assert!(!hostname().is_empty());
        assert!(kernel().starts_with("Linux"));
        assert!(cpus() >= 1);
    }

    #[test]
    fn pinning_refuses_cpus_out_of_range() {
        // Pinning for real would pin the whole test runner.
        assert!(pin_process(libc::CPU_SETSIZE as usize).is_err());
    }
}
