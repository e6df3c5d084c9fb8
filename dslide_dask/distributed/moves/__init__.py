"""Live moves: a model's shards moved onto other workers while training goes on.

The vocabulary, stated once for the modules below and the code that calls them:

**move**
    The model re-placed at a step boundary: a new model (new actors, a new
    :class:`~dslide_dask.model.layout.ShardLayout`) built on the workers there are, less
    those asked to leave and plus those that joined, and training continued on it from
    the same step. No step is redone. A *re-balance* is a move the trainer decides on
    (workers left or joined; :meth:`~.rebalance.FollowsTheCluster.rebalance` asks for
    one between training calls). Each move is recorded as a :class:`~.policy.Move`. A
    move is *live* (worker to worker, in the three phases below) when every worker has
    room for its old and new parts at once
    (:func:`~dslide_dask.distributed.memory_plan.fits_while_moving`), otherwise it goes
    *through a checkpoint* and training stops throughout.

A live move goes in three phases; training stops only for the last (the user guide,
``docs/elastic.md``, counts the first two as one, as training goes on through both):

1. **prepare**: the new model's actors are built (the *prepared* model,
   :class:`~.switch.PreparedMove`) while the old model trains on, and take the
   *handover* (:mod:`.handover`): copies of the old model's small parts (hidden layers,
   the coordinator's counters and data position), and of its rows too when they cannot
   be mirrored, carried by tasks from the old parts' workers to the new ones.
2. **mirror**: once the new actors stand, the old shards stream their rows to the new
   shards, a slice a step, and after every step what it did to the rows sent so far; the
   new shards *replay* those updates, so their rows stay the old ones bit for bit
   (:mod:`.mirroring` carries the messages; :mod:`dslide_dask.model.mirror` is the
   sending and receiving state, :mod:`dslide_dask.kernels.mirror` the kernel that cuts a
   step's update down to the rows sent).
3. **switch** (:mod:`.switch`): at the first step boundary after every new shard holds
   the rows as of the step before, training pauses until they have replayed this step;
   the small parts are *settled* (copied again, as they are now, into the standing new
   actors); the trainer *adopts* the new model (trains with it from now on).

The remaining verbs: a prepared model is *dropped* when it will not be switched to (a
worker lost, a build or a replay failed; the run goes on with the model it has). After a
switch, the trainer *lets go* of the old model: its actors are released at the next step
boundary and collected while the next steps run. Then the workers whose rows went are
*retired* (Dask's ``retire_workers``, which refuses a worker while it holds an actor, and
whose refusal is the notice that a worker is asked to leave; :mod:`.policy`).

Modules: :mod:`.policy` (who is asked to leave, when a join pays, what a move was),
:mod:`.rebalance` (deciding, starting and recording moves), :mod:`.handover` (the copy
tasks), :mod:`.mirroring` (the row stream's transport), :mod:`.switch` (watching a
prepared model and switching to it). The model's side knows nothing of Dask
(:mod:`dslide_dask.model.mirror`, :mod:`dslide_dask.kernels.mirror`); this package
is orchestration only.
"""
