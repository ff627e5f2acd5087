/* The release of clowder's DEX that dexrun and dexnode report with --version. */
#ifndef DEX_VERSION_H
#define DEX_VERSION_H

#define DEX_RELEASE "0.1.0"

#endif
