"""Capacity planning (``asrpool plan``): a discrete-event simulation of one pool.

The simulation places streams with the router's own placement policy
(:mod:`asrpool.router.policies`) and scales with the operator's own autoscaler
(:mod:`asrpool.operator.autoscaling`); only the clock is simulated. Importing this
package loads nothing heavy: numpy loads with the simulation, matplotlib with the plot.
"""
