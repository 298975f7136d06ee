// study.h — the comparison and the analyses of study.cpp.
#pragma once
#include <vector>

#include "support/model/lime.h"

int cmd_compare(int argc, char** argv);  // ./lime compare
// Router weight by source layer, rows (layers 1..L-1) normalised to sum 1; NaN where no source.
std::vector<std::vector<double>> router_heatmap(const Model& model);
// Entropy of one layer's vectors x (N, T, D) over N sequences, lens[s] real
// positions each, as the paper's authors measure it (study.cpp): features
// z-scored over all sequences and positions, Renyi entropy of order alpha of
// each sequence's Gram spectrum; mean and std over the sequences.
struct EntropyStat { double mean = 0, std = 0; };
EntropyStat layer_entropy(const float* x, int N, int T, int D, const std::vector<int>& lens, double alpha);
