// support/lib/gpu_peaks.h — the dense peaks (TFLOP/s, no sparsity) of a few
// data-centre GPUs, from their datasheets: what `./lime bench` measures its
// MFU against. The first row whose name the device's name contains wins;
// an unlisted sm_90 or sm_80 part falls back to the H100 SXM or A100 figures.
#pragma once
#include <string>

struct GpuPeak {
    double tf32 = 0, fp32 = 0;  // TFLOP/s: TF32 tensor cores, plain float32
    std::string source;         // which datasheet row, for the report
};

// The peaks of a device by its name and compute capability (gpu_info gives them); 0 (no MFU) for an unknown device.
inline GpuPeak gpu_peak(const std::string& name, int major, int minor) {
    struct Row { const char* name; double tf32, fp32; };
    static const Row rows[] = {
        {"H200", 494.7, 66.9},        // SXM; GH200 matches too
        {"H100 PCIe", 378.0, 51.2},
        {"H100", 494.7, 66.9},        // SXM
        {"A100", 156.0, 19.5},
        {"L40S", 183.0, 91.6},
        {"A10", 62.5, 31.2},
    };
    for (const Row& r : rows)
        if (name.find(r.name) != std::string::npos)
            return {r.tf32, r.fp32, std::string(r.name) + " datasheet, dense"};
    if (major == 9 && minor == 0) return {494.7, 66.9, "sm_90: H100 SXM datasheet, dense"};
    if (major == 8 && minor == 0) return {156.0, 19.5, "sm_80: A100 datasheet, dense"};
    return {0, 0, "unknown device: no MFU"};
}
