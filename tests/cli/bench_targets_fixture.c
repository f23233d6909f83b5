/* `mapping bench` with two fixed sections instead of measurements, to pin
 * down how targets are reported (tests/cli/check_bench_strict.cmake): the
 * figures have known values, so every verdict is known. */
#include "bench.h"

int bench_main(int argc, char **argv);

/* One figure per verdict: met, not met, noise (a cost below zero), met only
 * once the target is scaled to the run's size, and noise on a figure with
 * no target (reported, never counted against --strict). */
BENCH_SECTION(fixture_mixed, 1, "fixture_mixed", "figures of known value: met, missed, noise, scaled")
{
    bench_figure(ctx, "fixture_met", 1.5, "x", "fixture ratio, met (target <= 2)");
    bench_figure(ctx, "fixture_missed", 3.0, "x", "fixture ratio, missed (target <= 2)");
    bench_figure(ctx, "fixture_noise", -12.0, "ns", "fixture cost below zero (target <= 1000 ns)");
    bench_figure_sized(ctx, "fixture_scaled", 700.0, "x", "fixture speedup, 64 MiB (target >= 10000)", (size_t)64 << 20,
                       (size_t)1 << 30);
    bench_figure(ctx, "fixture_untargeted", -1.0, "ns", "fixture difference without a target");
    return 0;
}

BENCH_SECTION(fixture_met, 2, "fixture_met", "figures of known value that all meet their targets")
{
    bench_figure(ctx, "fixture_met_lt", 50.0, "ns", "fixture time (target < 100 ns)");
    bench_figure(ctx, "fixture_met_zero", 0.0, "B", "fixture bytes (target 0)");
    bench_figure(ctx, "fixture_plain", 3.0, "x", "fixture figure without a target");
    return 0;
}

/* A target that does not apply to the device (n/a, with why), beside a met
 * one; a note and a figure without a target, shown with --explain only. */
BENCH_SECTION(fixture_na, 3, "fixture_na", "a target that does not apply here, a note, a figure without a target")
{
    bench_note(ctx, "fixture note: what the table means");
    bench_figure(ctx, "fixture_headline", 2.0, "x", "fixture headline without a target");
    bench_figure_na(ctx, "fixture_na", 1.0, "", "fixture fraction (target <= 0.02)", "fixture: declined here by design");
    bench_figure(ctx, "fixture_na_met", 1.0, "x", "fixture ratio beside it (target <= 2)");
    return 0;
}

int main(int argc, char **argv) /* argv[0] stands for "bench" */
{
    return bench_main(argc, argv);
}
