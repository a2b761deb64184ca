// SPDX-License-Identifier: GPL-2.0

//! An interrupt-safe spinlock for the kernel crate's generic `Lock`.
//!
//! The 6.12 kernel crate only has a plain `spin_lock` backend. Completion
//! queues and queue pairs are touched from process context (verbs calls),
//! from softirq context (the socket's data-ready path) and from consumers'
//! completion handlers, which may run in hard interrupt context; their locks
//! must therefore disable interrupts while held. This backend does that with
//! `spin_lock_irqsave`, through two C helpers.

use crate::ffi;
use kernel::{bindings, ffi::c_char, sync::lock::Backend};

/// A spinlock that disables local interrupts while held.
pub(crate) type IrqSpinLock<T> = kernel::sync::lock::Lock<T, IrqSpinLockBackend>;

/// Creates an [`IrqSpinLock`] initialiser with a static lock class.
macro_rules! new_irq_spinlock {
    ($inner:expr $(, $name:literal)? $(,)?) => {
        $crate::sync::IrqSpinLock::new(
            $inner, kernel::optional_name!($($name)?), kernel::static_lock_class!())
    };
}
pub(crate) use new_irq_spinlock;

/// The backend of [`IrqSpinLock`].
pub(crate) struct IrqSpinLockBackend;

// SAFETY: `lock` acquires the spinlock (exclusive until `unlock`), `unlock`
// releases it with the flags saved by the matching `lock`, and `init`
// initialises it with the given class; these are the C primitives.
unsafe impl Backend for IrqSpinLockBackend {
    type State = bindings::spinlock_t;
    /// The interrupt flags saved by `spin_lock_irqsave`.
    type GuardState = usize;

    unsafe fn init(ptr: *mut Self::State, name: *const c_char, key: *mut bindings::lock_class_key) {
        // SAFETY: the caller passes a valid, uninitialised spinlock and a
        // static name and class.
        unsafe { bindings::__spin_lock_init(ptr, name, key) }
    }

    unsafe fn lock(ptr: *mut Self::State) -> Self::GuardState {
        // SAFETY: the caller passes an initialised spinlock; the module's
        // bindgen type of `spinlock_t` is the same C type.
        unsafe { ffi::siw_rs_h_spin_lock_irqsave(ptr.cast()) }
    }

    unsafe fn unlock(ptr: *mut Self::State, flags: &Self::GuardState) {
        // SAFETY: the caller holds the lock, taken by `lock` which returned
        // `flags`.
        unsafe { ffi::siw_rs_h_spin_unlock_irqrestore(ptr.cast(), *flags) }
    }
}

/// A spinlock that disables bottom halves while held: for state shared
/// between process context and softirq context that is never touched from
/// hard interrupts nor with interrupts off (the receive path, which calls
/// into the TCP stack, which may re-enable bottom halves but must not run
/// with interrupts off; the memory regions and their STag table).
pub(crate) type BhSpinLock<T> = kernel::sync::lock::Lock<T, BhSpinLockBackend>;

/// Creates a [`BhSpinLock`] initialiser with a static lock class.
macro_rules! new_bh_spinlock {
    ($inner:expr $(, $name:literal)? $(,)?) => {
        $crate::sync::BhSpinLock::new(
            $inner, kernel::optional_name!($($name)?), kernel::static_lock_class!())
    };
}
pub(crate) use new_bh_spinlock;

/// The backend of [`BhSpinLock`].
pub(crate) struct BhSpinLockBackend;

// SAFETY: `lock` acquires the spinlock (exclusive until `unlock`) with
// bottom halves disabled, `unlock` releases it and re-enables them; `init`
// initialises it with the given class.
unsafe impl Backend for BhSpinLockBackend {
    type State = bindings::spinlock_t;
    type GuardState = ();

    unsafe fn init(ptr: *mut Self::State, name: *const c_char, key: *mut bindings::lock_class_key) {
        // SAFETY: the caller passes a valid, uninitialised spinlock and a
        // static name and class.
        unsafe { bindings::__spin_lock_init(ptr, name, key) }
    }

    unsafe fn lock(ptr: *mut Self::State) -> Self::GuardState {
        // SAFETY: the caller passes an initialised spinlock.
        unsafe { ffi::siw_rs_h_spin_lock_bh(ptr.cast()) }
    }

    unsafe fn unlock(ptr: *mut Self::State, _: &Self::GuardState) {
        // SAFETY: the caller holds the lock.
        unsafe { ffi::siw_rs_h_spin_unlock_bh(ptr.cast()) }
    }
}
