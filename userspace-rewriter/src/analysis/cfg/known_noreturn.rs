//! The names of functions known never to return, matched before any
//! inference ([`is_known_noreturn`]).

/// Names of functions that never return (matched without `@plt` and symbol
/// versions).
const KNOWN_NORETURN: &[&str] = &[
    "abort",
    "exit",
    "_exit",
    "_Exit",
    "quick_exit",
    "__stack_chk_fail",
    "__stack_chk_fail_local",
    "__assert_fail",
    "__assert_perror_fail",
    "__assert",
    "__cxa_throw",
    "__cxa_rethrow",
    "__cxa_bad_cast",
    "__cxa_bad_typeid",
    "__cxa_throw_bad_array_new_length",
    "__cxa_pure_virtual",
    "_Unwind_Resume",
    "__fortify_fail",
    "__chk_fail",
    "__libc_fatal",
    "__libc_start_main",
    "err",
    "errx",
    "verr",
    "verrx",
    "longjmp",
    "_longjmp",
    "siglongjmp",
    "__longjmp_chk",
    "pthread_exit",
    "thrd_exit",
    "__pthread_unwind",
    "__pthread_unwind_next",
    "_ZSt9terminatev",
];

/// Whether `name` (already without `@plt`/version) is a known noreturn
/// function (also libstdc++'s `std::__throw_*` helpers).
pub(crate) fn is_known_noreturn(name: &str) -> bool {
    KNOWN_NORETURN.contains(&name) || name.starts_with("_ZSt") && name.contains("__throw_")
}
