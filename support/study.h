// study.h — the comparison and the analyses of study.cpp.
#pragma once
#include <vector>

#include "support/lime.h"

int cmd_compare(int argc, char** argv);  // ./lime compare
// Router weight by source layer, rows (layers 1..L-1) normalised to sum 1; NaN where no source.
std::vector<std::vector<double>> router_heatmap(const Model& model);
// Renyi entropy of order alpha of one sequence's z-scored value vectors v (T, D).
double value_entropy(const float* v, int T, int D, double alpha);
